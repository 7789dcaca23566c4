"""The brute force over (plan, schedule parameters), each simulated: every dp, order of chip types, layer
split and parameter value of one-chip stages (tp 1). The planner's plans are measured against it on small
instances (tests/heteroauto, bench/heteroauto_vs_brute.py); exponential, for a handful of chips only.

`brute_force` covers the plans that use every chip with each type contiguous along the pipeline;
`brute_force(pb, extended=True)` the larger space of issue 30 item 4: any dp that divides the micro-batch
count, any number of each type's chips per replica (the rest idle), in any order along the pipeline
(types interleaved: X Y X)."""
from __future__ import annotations

import itertools
import math
from dataclasses import replace
from typing import Any, Iterator

from ..spec import InfeasibleError
from .costs import StageSpec, micro_batches, virtual_stages
from .extended import sequences
from .plan_sim import simulate_stages
from .planning import Problem
from .reference import compositions
from .space import dp_candidates

WARMUP_STEPS = 4  # H-1F1B: every extra warm-up 0 .. WARMUP_STEPS - 1 per boundary


def schedule_options(schedule: str, stages: list[StageSpec],
                     b: int) -> Iterator[tuple[dict[str, Any], list[StageSpec]]]:
    """Every parameter value of `schedule` on `stages`, with the stages the simulator runs: interleaved
    1F1B's chunks up to the smallest stage's layers (when the micro-batches come in groups of the stages),
    H-1F1B's extra warm-ups, or the schedule's one option without parameters."""
    p = len(stages)
    if schedule == "interleaved":
        if b % p == 0:
            for v in range(1, min(s.layers for s in stages) + 1):
                yield {"chunks": v}, virtual_stages(stages, v)
    elif schedule == "h1f1b":
        for extra in itertools.product(range(WARMUP_STEPS), repeat=p - 1):
            yield {"extra_warmup": list(extra)}, stages
    else:
        yield {}, stages


def brute_force(pb: Problem, extended: bool = False,
                tp: bool = False) -> tuple[float, int, list[StageSpec], dict[str, Any]]:
    """The least simulated time of any plan of one-chip stages (tp 1) with any parameters that fit in
    memory, with its dp, stages and parameters (inf and no stages when none fits); `extended`: over
    extended_sequences instead of one_chip_sequences; `tp`: the larger space with every TP size a type
    allows (tp_sequences; a plan whose TP group fits in no node is left out). A stage recomputes only
    where it does not fit otherwise: recompute adds compute and no transfer, and a stage's memory depends on
    its own flag alone, so that choice loses no plan."""
    cm, sched = pb.cm, pb.train.schedule
    best: tuple[float, int, list[StageSpec], dict[str, Any]] = (math.inf, 0, [], {})
    chosen = tp_sequences(pb) if tp else ((dp, b, [(c, 1) for c in seq]) for dp, b, seq in
                                          (extended_sequences if extended else one_chip_sequences)(pb))
    for dp, b, typed in chosen:
        caps = [cm.cluster.chip(c).usable_bytes for c, _ in typed]
        for split in compositions(cm.model.layers, len(typed)):
            plain = [StageSpec(c, t, n, False) for (c, t), n in zip(typed, split)]
            for q, _ in schedule_options(sched, plain, b):
                mems = [cm.evaluate([replace(s, recompute=r) for s in plain], dp, b, sched,
                                    params=q).stage_memory_bytes for r in (False, True)]
                if any(min(m0, m1) > c for m0, m1, c in zip(*mems, caps)):
                    continue
                stages = [replace(s, recompute=m0 > c) for s, m0, c in zip(plain, mems[0], caps)]
                run = virtual_stages(stages, q["chunks"]) if "chunks" in q else stages
                try:
                    t = simulate_stages(cm, run, dp, sched, params=q).iteration_time_s
                except InfeasibleError:  # a TP group that fits in no node (spec/placement.py)
                    continue
                if t < best[0]:
                    best = (t, dp, stages, q)
    return best


def tp_sequences(pb: Problem) -> Iterator[tuple[int, int, list[tuple[str, int]]]]:
    """(dp, micro-batches per replica, the (chip, tp) of each stage) of the larger space with TP: every dp
    that divides the micro-batch count, every sequence of stages of any TP size the model and the type
    allow using at most count // dp chips of each type (extended.sequences), in any order."""
    cm = pb.cm
    total = cm.train.micro_batches_total
    for dp in (d for d in range(1, total + 1) if total % d == 0):
        for seq in sequences(cm, dp):
            yield dp, total // dp, seq


def one_chip_sequences(pb: Problem) -> Iterator[tuple[int, int, list[str]]]:
    """(dp, micro-batches per replica, the chip of each stage) of every order of the chip types in one-chip
    stages, at every dp, with no more stages than layers."""
    cm = pb.cm
    counts = {c.name: c.count for c in cm.cluster.chips}
    for dp in dp_candidates(cm.cluster, cm.train):
        b = micro_batches(cm.train, dp)
        for order in itertools.permutations(counts):
            seq = [n for n in order for _ in range(counts[n] // dp)]
            if len(seq) <= cm.model.layers:
                yield dp, b, seq


def extended_sequences(pb: Problem) -> Iterator[tuple[int, int, list[str]]]:
    """(dp, micro-batches per replica, the chip of each stage) of one-chip stages: every dp that divides the
    micro-batch count, every count n_c of each type per replica with dp n_c chips of it at most (the rest
    idle), every distinct order of those stages along the pipeline, at least one stage and no more than the
    layers."""
    cm = pb.cm
    counts = {c.name: c.count for c in cm.cluster.chips}
    total = cm.train.micro_batches_total
    for dp in (d for d in range(1, total + 1) if total % d == 0):
        b = total // dp
        for per in itertools.product(*(range(n // dp + 1) for n in counts.values())):
            if not 0 < sum(per) <= cm.model.layers:
                continue
            pool = [n for n, k in zip(counts, per) for _ in range(k)]
            for seq in sorted(set(itertools.permutations(pool))):
                yield dp, b, list(seq)
