"""The exact reference search: every dp, order of chip types, per-group TP choice, layer split, per-stage
recompute flag and (with `inner_dp`) per-stage split of a stage's chips into inner replicas, each scored by
the cost model. Exponential, for small clusters only; the fast search (search.py, with inner_dp.py's local
search on top) is tested against it."""
from __future__ import annotations

import itertools
import math
from typing import Iterator

from .costs import CostModel, StageSpec, micro_batches
from .inner_dp import inner_dp_choices
from .space import dp_candidates, stage_tp_choices


def compositions(n: int, k: int) -> Iterator[list[int]]:
    """Every way to write n as an ordered sum of k positive integers."""
    for cuts in itertools.combinations(range(1, n), k - 1):
        b = (0,) + cuts + (n,)
        yield [b[i + 1] - b[i] for i in range(k)]


def reference_search(cm: CostModel, group_size: int, inner_dp: bool = False) -> float:
    """The least iteration time of any feasible plan (inf when none fits). `inner_dp`: also every way of
    running each stage's tp chips as inner_dp replicas of tp / inner_dp (inner_dp.inner_dp_choices)."""
    best = math.inf
    L = cm.model.layers
    for dp in dp_candidates(cm.cluster, cm.train):
        b = micro_batches(cm.train, dp)
        per_type = {c.name: stage_tp_choices(c, dp, group_size) for c in cm.cluster.chips}
        for order in itertools.permutations([c.name for c in cm.cluster.chips]):
            for combo in itertools.product(*(per_type[n] for n in order)):
                seq = [(n, t) for n, ts in zip(order, combo) for t in ts]
                if len(seq) > L:
                    continue
                for ls in compositions(L, len(seq)):
                    for rs in itertools.product((False, True), repeat=len(seq)):
                        base = [StageSpec(c, t, nl, r) for (c, t), nl, r in zip(seq, ls, rs)]
                        splits = ([[s, *inner_dp_choices(cm, s)] for s in base] if inner_dp else [[s] for s in base])
                        for st in itertools.product(*splits):
                            e = cm.evaluate(list(st), dp, b)
                            if e.feasible:
                                best = min(best, e.iteration_time_s)
    return best
