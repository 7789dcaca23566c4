"""Exact best layer split for a fixed sequence of stages, with each stage's recompute flag decided by its
layer count (recompute only when the layers do not fit without it: off is faster whenever it fits).

T(l) = max(Lambda, max_k own_k(l_k)) + max_k y_k(l_k) + sum_k phi_k(l_k) + C, where own is a stage's
steady-state term, y its update term and phi its fill/drain share (see costs.py). For bottleneck levels
Z (own_k <= Z) and update levels W (y_k <= W) the cheapest fill under the implied per-stage layer caps is
computed exactly (greedy when costs are linear, a small DP otherwise); the optimum is the least
max(Z, Lambda) + W + fill over the candidate levels (every own_k(l) and y_k(l)). Both scans start at the
least feasible level and stop once the level plus the unconstrained fill bound cannot beat the best.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import cast

import numpy as np

from .stagekind import StageTerms


@dataclass
class SplitResult:
    total: float
    layers: list[int]
    recompute: list[bool]


# _min_fill takes a stage of at most this many layer counts one count at a time, a larger one all at once (the
# per-count numpy calls cost more from about here on; the fixed cost of the all-at-once form, less below)
_ROWS_AT_ONCE = 12

Linear = tuple[list[int], list[float], list[float]]  # per stage: m0, b0, beta (_min_fill's linear case)


def _linear(opts: list[StageTerms]) -> Linear:
    return [o.m0 for o in opts], [o.b0 for o in opts], [o.beta for o in opts]


def _min_fill(opts: list[StageTerms], caps: list[int], L: int, order: list[int],
              linear: Linear) -> tuple[float, list[int]] | None:
    """Cheapest sum phi_k(l_k) with 1 <= l_k <= caps[k] and sum l_k = L. `order` (_by_beta) and `linear`
    (_linear): the caller's, who asks for many caps of one sequence."""
    if sum(caps) < L or min(caps) < 1:
        return None
    m0s, b0s, betas = linear
    if all([c <= m for c, m in zip(caps, m0s)]):  # linear costs: fill the cheapest stages first
        ls = [1] * len(opts)
        rest = L - len(opts)
        for k in order:
            add = caps[k] - 1
            if rest <= add:  # min(rest, caps[k] - 1)
                add = rest
            ls[k] += add
            rest -= add
            if not rest:
                break
        # StageTerms.phi with every stage within m0 (the same arithmetic)
        return sum([b0 + beta * nl for b0, beta, nl in zip(b0s, betas, ls)]), ls
    inf = float("inf")
    f = np.full(L + 1, inf)
    f[0] = 0.0
    choices = []
    cols = np.arange(L + 1)
    for o, c in zip(opts, caps):
        top = min(c, L)
        if top <= _ROWS_AT_ONCE:  # g[n] = min over nl of f[n - nl] + phi(nl), the least nl on a tie
            g = np.full(L + 1, inf)
            ch = np.zeros(L + 1, dtype=np.int64)
            for nl in range(1, top + 1):
                cand = f[:L + 1 - nl] + o.phi(nl)
                better = cand < g[nl:]
                g[nl:][better] = cand[better]
                ch[nl:][better] = nl
            f = g
            choices.append(ch)
            continue
        # the same for every nl at once: row nl - 1 of `rows` is f shifted by nl (inf where n < nl) plus
        # phi(nl), StageTerms.phi's arithmetic on arrays; argmin's first of equals is the least nl
        nls = np.arange(1, top + 1)
        slope = np.full(top, o.beta, dtype=np.float64) if top <= o.m0 else np.where(nls <= o.m0, o.beta, o.beta1)
        shift = cols[None, :] - nls[:, None]
        rows = np.where(shift >= 0, f[np.maximum(shift, 0)], inf) + (o.b0 + slope * nls)[:, None]
        best = np.argmin(rows, axis=0)
        f = rows[best, cols]
        choices.append(np.where(f < inf, best + 1, 0))
    if not math.isfinite(f[L]):
        return None
    ls, n = [], L
    for ch in reversed(choices):
        ls.append(int(ch[n]))
        n -= ls[-1]
    return float(f[L]), ls[::-1]


def _by_beta(opts: list[StageTerms]) -> list[int]:
    """The stages in increasing fill cost per layer (ties in stage order): the greedy fills' order."""
    return sorted(range(len(opts)), key=lambda k: opts[k].beta)


def _fill_floor(opts: list[StageTerms], caps: list[int], L: int, order: list[int]) -> float:
    """A lower bound on any fill under `caps`: phi_k(l) >= b0 + beta * l, greedy (`order`: _by_beta)."""
    total = sum(o.b0 + o.beta for o in opts)
    rest = L - len(opts)
    for k in order:
        add = min(rest, caps[k] - 1)
        total += add * opts[k].beta
        rest -= add
        if not rest:
            break
    return cast(float, total)


def _start_level(at_one: float, offs: list[float], slopes: list[float], L: int) -> float:
    """Where the level scans start: the highest value at one layer, or the fractional level at which the
    linear lower bounds offs[k] + slopes[k] * l hold L layers, whichever is higher."""
    if min(slopes) > 0:
        return max(at_one, (L + sum(o / a for o, a in zip(offs, slopes))) / sum(1 / a for a in slopes))
    return at_one


def _olevel(opts: list[StageTerms], full: list[int], L: int) -> float | None:
    """Least max_k own_k(l_k) with 1 <= l_k <= full[k] and sum l_k = L: starts at the fractional level, then
    steps to the next breakpoint until the caps hold L layers. StageTerms.own and StageTerms.cap are inlined
    (the same arithmetic): the scan can step through many breakpoints."""
    if sum(full) < L or min(full) < 1:
        return None
    z = _start_level(max(o.own(1) for o in opts), [o.a0 for o in opts], [o.a for o in opts], L)
    floor = math.floor
    stages = [(o.a0, o.a, o.a1, o.m0, o.m1, c) for o, c in zip(opts, full)]
    while True:
        held, nxt = 0, None
        for a0, s0, s1, m0, m1, c in stages:
            c0 = m0 if s0 <= 0 else min(m0, floor((z - a0) / s0 + 1e-12))
            cap = None
            if c0 >= m0 and m1 > m0:
                c1 = m1 if s1 <= 0 else min(m1, floor((z - a0) / s1 + 1e-12))
                if c1 > m0:
                    cap = c1
            if cap is None:
                cap = c0 if c0 > 0 else 0
            if cap < c:
                held += cap
                at = a0 + (s0 if cap + 1 <= m0 else s1) * (cap + 1)
                if nxt is None or at < nxt:
                    nxt = at
            else:
                held += c
        if held >= L:
            return z
        if nxt is None:  # every stage at its cap below L layers: the check on entry rules it out
            raise AssertionError("_olevel: no breakpoint left below L layers")
        z = nxt


def _ylevel(y0s: list[float], ups: list[float], full: list[int], caps: list[int], L: int) -> float | None:
    """The same scan for the update terms under per-stage caps (y is linear: its cap is a division), with
    StageTerms.y and StageTerms.ycap inlined; it runs once per bottleneck level, the split's hot loop. Kept apart
    from _olevel: a non-positive slope caps all or nothing here, and a per-stage callback shared by both
    scans is what made them slow."""
    if sum(caps) < L or min(caps) < 1:
        return None
    z = _start_level(max(y0 + u * 1 for y0, u in zip(y0s, ups)), y0s, ups, L)  # y(1)
    floor = math.floor
    stages = list(zip(y0s, ups, full, caps))
    while True:
        # the layers held at z and the next breakpoint, in one sweep (min's first-of-equals rule kept)
        held, nxt = 0, None
        for y0, u, m, c in stages:
            if u <= 0:
                yc = m if z >= y0 - 1e-12 else 0
            else:
                yc = floor((z - y0) / u + 1e-12)
                if yc < 0:
                    yc = 0
            if yc < c:
                held += yc
                at = y0 + u * (yc + 1)
                if nxt is None or at < nxt:
                    nxt = at
            else:
                held += c
        if held >= L:
            return z
        if nxt is None:  # as in _olevel
            raise AssertionError("_ylevel: no breakpoint left below L layers")
        z = nxt


def best_split(opts: list[StageTerms], L: int, lam: float = -math.inf, const: float = 0.0,
               bound: float = math.inf) -> SplitResult | None:
    """Optimal split, or None when infeasible or when no split beats `bound`."""
    p = len(opts)
    full = [o.lmax for o in opts]
    if p > L or min(full) < 1 or sum(full) < L:
        return None
    y_sl, y_off = [o.ups for o in opts], [o.y0 for o in opts]
    z0 = _olevel(opts, full, L)
    w_floor = _ylevel(y_off, y_sl, full, full, L)
    if z0 is None or w_floor is None:  # ruled out by the check above
        return None
    z = z0
    order = _by_beta(opts)
    floor_fill = _fill_floor(opts, full, L, order)
    best: SplitResult | None = None
    best_t = bound
    # the update level's loop is the hot one (100,000 chips: seconds): StageTerms.ycap, own and y inlined
    # over tuples of each stage's numbers, the same arithmetic in the same order
    ys = list(zip(y_off, y_sl))
    owns = [(o.a0, o.a, o.a1, o.m0) for o in opts]
    linear = _linear(opts)
    rising = all(u > 0 for u in y_sl)  # every update grows with the layers (the usual case): one comprehension
    floor = math.floor
    fills: dict[tuple[int, ...], tuple[float, list[int]] | None] = {}
    while max(z, lam) + w_floor + floor_fill + const < best_t:
        zcaps = [o.cap(z) for o in opts]
        w = _ylevel(y_off, y_sl, full, zcaps, L)
        zfloor = _fill_floor(opts, zcaps, L, order)
        while w is not None and max(z, lam) + w + zfloor + const < best_t:
            if rising:  # min(c, max(0, floor(...))), c >= 0
                caps = [c if c <= (yc := floor((w - y0) / u + 1e-12)) else yc if yc > 0 else 0
                        for (y0, u), c in zip(ys, zcaps)]
            else:
                caps = [min(c, o.ycap(w)) for o, c in zip(opts, zcaps)]
            # the fill's lower bound under these caps first (a split's time is at least this, so it cannot win
            # where this reaches the best), and a fill already computed for the same caps at another level
            key = tuple(caps)
            if key in fills:
                got = fills[key]
            elif max(z, lam) + w + _fill_floor(opts, caps, L, order) + const >= best_t:
                got = None
            else:
                got = fills[key] = _min_fill(opts, caps, L, order, linear)
            if got is not None:
                ls = got[1]
                t = max(max([a0 + (a if nl <= m0 else a1) * nl for (a0, a, a1, m0), nl in zip(owns, ls)]), lam) \
                    + max([y0 + u * nl for (y0, u), nl in zip(ys, ls)]) + got[0] + const
                if t < best_t:
                    best_t = t
                    best = SplitResult(t, ls, [o.mode(nl) == 1 for o, nl in zip(opts, ls)])
            nxt = [y0 + u * (c + 1) for (y0, u), c, zc in zip(ys, caps, zcaps) if c < zc]
            if not nxt:
                break
            w = min(nxt)
        nxt = [o.own(c + 1) for o, c in zip(opts, zcaps) if o.ok(c + 1)]
        if not nxt or z >= lam and max(z, lam) >= best_t:
            break
        z = min(nxt)
    return best
