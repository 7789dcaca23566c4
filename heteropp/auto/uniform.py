"""The paper's ablation baseline "uniform 1F1B instead of HeteroPP" (H2 Table 9): the same chips, one TP
size on every stage, the layers split evenly over all stages, the standard 1F1B schedule.

Taken at its best so the comparison is fair to it: every dp, shared TP size and order of chip types is
tried, a stage recomputes only when its even share does not fit otherwise, and the simulator picks.
"""
from __future__ import annotations

import itertools
import math

from .costs import CostModel, StageSpec, in_flight, micro_batches
from .plan_sim import iteration_time
from .candidates import Candidate
from .space import dp_candidates, tp_counts, tp_sizes


def even_layers(L: int, p: int) -> list[int]:
    """L layers over p stages, sizes differing by at most one; the extra layers go to the later stages,
    which hold fewer micro-batches under 1F1B."""
    q, r = divmod(L, p)
    return [q + (1 if k >= p - r else 0) for k in range(p)]


def uniform_1f1b(cm: CostModel) -> Candidate | None:
    """The best uniform-1F1B plan by simulated iteration time (its `time_s`); None when none fits."""
    L, chips = cm.model.layers, cm.cluster.chips
    tps = set.intersection(*(set(tp_sizes(c, *tp_counts(cm.model))) for c in chips))
    best: Candidate | None = None
    for dp, tp in itertools.product(dp_candidates(cm.cluster, cm.train), sorted(tps)):
        if any(c.count % (tp * dp) for c in chips):
            continue
        b = micro_batches(cm.train, dp)
        for order in itertools.permutations(chips):
            seq = [c.name for c in order for _ in range(c.count // (tp * dp))]
            if len(seq) > L:
                break
            stages = _fit(cm, seq, tp, dp, b, even_layers(L, len(seq)))
            if stages is None:
                continue
            t = iteration_time(cm, stages, dp, "1f1b")
            if best is None or t < best.time_s:
                best = Candidate(t, dp, stages, f"uniform 1F1B dp={dp} tp={tp}")
    return best


def _fit(cm: CostModel, seq: list[str], tp: int, dp: int, b: int, layers: list[int]) -> list[StageSpec] | None:
    """Stages with recompute only where needed; None when a stage's share does not fit even with it."""
    p, out = len(seq), []
    for k, (chip, n) in enumerate(zip(seq, layers)):
        inflight = in_flight("1f1b", k, p, b)
        for r in (False, True):
            if n <= cm.max_layers(chip, tp, r, dp, inflight, k == 0, k == p - 1):
                out.append(StageSpec(chip, tp, n, r))
                break
        else:
            return None
    return out


def relative_time(cm: CostModel, auto_simulated_s: float) -> float:
    """Uniform 1F1B's simulated iteration time over another plan's (the paper reports 126.4% on Exp-C-1)."""
    u = uniform_1f1b(cm)
    return u.time_s / auto_simulated_s if u else math.inf
