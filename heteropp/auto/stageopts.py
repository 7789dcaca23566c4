"""The cost model of one stage sequence in the form the exact layer split takes (stagekind.StageTerms): per-stage
coefficients, end-stage constants, memory caps and update offsets by the drain gaps, plus the link term and
the constant of the boundaries."""
from __future__ import annotations

import math
from dataclasses import replace
from functools import lru_cache

from ..spec.placement import PlacementError
from .costs import CostModel, StageSpec, in_flight
from .stagekind import StageTerms, per_layer


@lru_cache(maxsize=None)
def stage_opt(cm: CostModel, chip: str, tp: int, dp: int, b: int, n: int, first: bool, last: bool) -> StageTerms:
    own, fill, upd = per_layer(cm, chip, tp, dp, b)
    a0 = b0 = y0 = 0.0
    for e in cm.ends(chip, tp, dp, first, last):
        a0 += b * e.time - e.beta
        b0 += e.beta
        y0 += e.upd
    m0, m1 = (cm.max_layers(chip, tp, r, dp, n, first, last) for r in (False, True))
    return StageTerms(a0=a0, a=own[0], a1=own[1], m0=m0, m1=m1, beta=fill[0], ups=upd, y0=y0, b0=b0, beta1=fill[1])


def _placed(cm: CostModel, seq: list[tuple[str, int]], dp: int) -> tuple[list[bool | None], bool]:
    """Per stage, whether its placement (spec/placement.py) keeps its replicas in one node where its type's
    nodes are listed (None elsewhere), and whether every TP group fits in a node (a sequence that does not
    gets no layers: no split of it exists)."""
    if not cm.lists_nodes:
        return [None] * len(seq), True
    try:
        return cm.placed_one_node([StageSpec(c, t, 0, False) for c, t in seq], dp), True
    except PlacementError:
        return [None] * len(seq), False


def stage_opts(cm: CostModel, seq: list[tuple[str, int]], dp: int, b: int) -> tuple[list[StageTerms], float, float]:
    """StageTerms for a (chip, tp) sequence (update offsets by the drain gaps), the link term Lambda and the
    constant 2 * sum(e)."""
    p, sched = len(seq), cm.train.schedule
    gaps = cm.drain_gaps(seq, dp)
    placed, fits = _placed(cm, seq, dp)
    opts = []
    tie = cm.tie_update([StageSpec(c, t, 0, False) for c, t in seq], dp, p) if cm.prices_tie else 0.0
    for k, (chip, tp) in enumerate(seq):
        o = stage_opt(cm, chip, tp, dp, b, in_flight(sched, k, p, b), k == 0, k == p - 1)
        ups, y0 = o.ups, o.y0 + (tie if k in (0, p - 1) else 0.0)
        m0, m1 = (o.m0, o.m1) if fits else (0, 0)
        if (in_node := placed[k]) is not None:  # its type's nodes listed: the sync over the placed nodes' fabric
            one = StageSpec(chip, tp, 1, False)
            ups += cm.placed_sync_delta(one, dp, in_node, ())
            y0 += cm.placed_sync_delta(replace(one, layers=0), dp, in_node,
                                       tuple(w for f, w in ((k == 0, "first"), (k == p - 1, "last")) if f))
        # every field given, not dataclasses.replace: a third of the larger space's enumeration (extended.py)
        # went to replace's introspection
        opts.append(StageTerms(a0=o.a0, a=o.a, a1=o.a1, m0=m0, m1=m1, beta=o.beta, ups=ups, y0=y0 - gaps[k],
                               b0=o.b0, beta1=o.beta1, real=o.real, lam=o.lam, const=o.const))
    es = [cm.boundary(seq[k][0], seq[k][1], seq[k + 1][0], seq[k + 1][1], dp) for k in range(p - 1)]
    lam = max((b * e - 2 * e for e in es), default=-math.inf)
    lats = sum(cm.latency(seq[k][0], seq[k + 1][0]) for k in range(p - 1))
    return opts, lam, 2 * sum(es) + 2 * lats
