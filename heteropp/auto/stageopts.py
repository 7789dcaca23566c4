"""The cost model of one stage sequence in the form the exact layer split takes (split.StageOpt): per-stage
coefficients, end-stage constants, memory caps and update offsets by the drain gaps, plus the link term and
the constant of the boundaries."""
from __future__ import annotations

import math
from functools import lru_cache

from .costs import CostModel, in_flight
from .split import StageOpt
from .stagekind import stage_kind


@lru_cache(maxsize=None)
def stage_opt(cm: CostModel, chip: str, tp: int, dp: int, b: int, n: int, first: bool, last: bool) -> StageOpt:
    k = stage_kind(cm, chip, tp, dp, b)
    a0 = b0 = y0 = 0.0
    for flag, which in ((first, "first"), (last, "last")):
        if flag:
            e = cm.end(chip, tp, dp, which)
            a0 += b * e.time - e.beta
            b0 += e.beta
            y0 += e.upd
    m = tuple(cm.max_layers(chip, tp, r, dp, n, first, last) for r in (False, True))
    return StageOpt(a0, k.own, b0, k.fill, m, y0, k.upd)


def stage_opts(cm: CostModel, seq: list[tuple[str, int]], dp: int, b: int) -> tuple[list[StageOpt], float, float]:
    """StageOpts for a (chip, tp) sequence (update offsets by the drain gaps), the link term Lambda and the
    constant 2 * sum(e)."""
    p, sched = len(seq), cm.train.schedule
    gaps = cm.drain_gaps(seq, dp)
    opts = []
    for k, (chip, tp) in enumerate(seq):
        o = stage_opt(cm, chip, tp, dp, b, in_flight(sched, k, p, b), k == 0, k == p - 1)
        opts.append(StageOpt(o.a0, o.a, o.b0, o.bt, o.m, o.y0 - gaps[k], o.ups))
    es = [cm.boundary(seq[k][0], seq[k][1], seq[k + 1][0], seq[k + 1][1], dp) for k in range(p - 1)]
    lam = max((b * e - 2 * e for e in es), default=-math.inf)
    lats = sum(cm.latency(seq[k][0], seq[k + 1][0]) for k in range(p - 1))
    return opts, lam, 2 * sum(es) + 2 * lats
