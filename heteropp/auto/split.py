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

import numpy as np


@dataclass(frozen=True)
class StageOpt:
    """own(l) = a0 + a[r] * l, phi(l) = b0 + bt[r] * l, y(l) = y0 + ups * l, r = 0 when l <= m[0] else 1
    (needs l <= m[1])."""
    a0: float
    a: tuple[float, float]
    b0: float
    bt: tuple[float, float]
    m: tuple[int, int]
    y0: float = 0.0
    ups: float = 0.0

    def mode(self, l: int) -> int:
        return 0 if l <= self.m[0] else 1

    def ok(self, l: int) -> bool:
        return l <= self.m[0] or l <= self.m[1]

    def own(self, l: int) -> float:
        return self.a0 + self.a[self.mode(l)] * l

    def phi(self, l: int) -> float:
        return self.b0 + self.bt[self.mode(l)] * l

    def y(self, l: int) -> float:
        return self.y0 + self.ups * l

    @property
    def lmax(self) -> int:
        return max(self.m)

    def cap(self, z: float) -> int:
        """Most layers with own <= z (0 when not even one)."""
        c0 = self.m[0] if self.a[0] <= 0 else min(self.m[0], math.floor((z - self.a0) / self.a[0] + 1e-12))
        if c0 >= self.m[0] and self.m[1] > self.m[0]:
            c1 = self.m[1] if self.a[1] <= 0 else min(self.m[1], math.floor((z - self.a0) / self.a[1] + 1e-12))
            if c1 > self.m[0]:
                return c1
        return max(c0, 0)

    def ycap(self, w: float) -> int:
        """Most layers with y <= w (a division: y is linear)."""
        if self.ups <= 0:
            return self.lmax if w >= self.y0 - 1e-12 else 0
        return max(0, math.floor((w - self.y0) / self.ups + 1e-12))


@dataclass
class SplitResult:
    total: float
    layers: list[int]
    recompute: list[bool]


def _min_fill(opts: list[StageOpt], caps: list[int], L: int) -> tuple[float, list[int]] | None:
    """Cheapest sum phi_k(l_k) with 1 <= l_k <= caps[k] and sum l_k = L."""
    if sum(caps) < L or min(caps) < 1:
        return None
    if all(c <= o.m[0] for o, c in zip(opts, caps)):  # linear costs: fill the cheapest stages first
        ls = [1] * len(opts)
        rest = L - len(opts)
        for k in sorted(range(len(opts)), key=lambda k: opts[k].bt[0]):
            add = min(rest, caps[k] - 1)
            ls[k] += add
            rest -= add
            if not rest:
                break
        return sum(o.phi(l) for o, l in zip(opts, ls)), ls
    inf = float("inf")
    f = np.full(L + 1, inf)
    f[0] = 0.0
    choices = []
    for o, c in zip(opts, caps):
        g = np.full(L + 1, inf)
        ch = np.zeros(L + 1, dtype=np.int64)
        for l in range(1, min(c, L) + 1):
            cand = f[:L + 1 - l] + o.phi(l)
            better = cand < g[l:]
            g[l:][better] = cand[better]
            ch[l:][better] = l
        f = g
        choices.append(ch)
    if not math.isfinite(f[L]):
        return None
    ls, n = [], L
    for ch in reversed(choices):
        ls.append(int(ch[n]))
        n -= ls[-1]
    return float(f[L]), ls[::-1]


def _fill_floor(opts: list[StageOpt], caps: list[int], L: int) -> float:
    """A lower bound on any fill under `caps`: phi_k(l) >= b0 + bt[0] * l, greedy."""
    total = sum(o.b0 + o.bt[0] for o in opts)
    rest = L - len(opts)
    for k in sorted(range(len(opts)), key=lambda k: opts[k].bt[0]):
        add = min(rest, caps[k] - 1)
        total += add * opts[k].bt[0]
        rest -= add
        if not rest:
            break
    return total


def _level(val, cap, slopes: list[float], offs: list[float], caps: list[int], L: int) -> float | None:
    """Least max_k val(k, l_k) with 1 <= l_k <= caps[k] and sum l_k = L, for non-decreasing val(k, l) >=
    offs[k] + slopes[k] * l with cap(k, z) the most layers at level z (a division). Starts at the fractional
    level, then steps to the next breakpoint until the caps hold L layers."""
    p = len(caps)
    if sum(caps) < L or min(caps) < 1:
        return None
    z = max(val(k, 1) for k in range(p))
    if min(slopes) > 0:
        z = max(z, (L + sum(o / a for o, a in zip(offs, slopes))) / sum(1 / a for a in slopes))
    while True:
        cs = [min(cap(k, z), c) for k, c in enumerate(caps)]
        if sum(cs) >= L:
            return z
        z = min(val(k, c + 1) for k, c in enumerate(cs) if c < caps[k])


def best_split(opts: list[StageOpt], L: int, lam: float = -math.inf, const: float = 0.0,
               bound: float = math.inf) -> SplitResult | None:
    """Optimal split, or None when infeasible or when no split beats `bound`."""
    p = len(opts)
    full = [o.lmax for o in opts]
    if p > L or min(full) < 1 or sum(full) < L:
        return None
    own, cap = (lambda k, l: opts[k].own(l)), (lambda k, z: opts[k].cap(z))
    y, ycap = (lambda k, l: opts[k].y(l)), (lambda k, w: opts[k].ycap(w))
    a_sl, a_off = [o.a[0] for o in opts], [o.a0 for o in opts]
    y_sl, y_off = [o.ups for o in opts], [o.y0 for o in opts]
    z = _level(own, cap, a_sl, a_off, full, L)
    w_floor = _level(y, ycap, y_sl, y_off, full, L)
    floor_fill = _fill_floor(opts, full, L)
    best: SplitResult | None = None
    best_t = bound
    while max(z, lam) + w_floor + floor_fill + const < best_t:
        zcaps = [o.cap(z) for o in opts]
        w = _level(y, ycap, y_sl, y_off, zcaps, L)
        zfloor = _fill_floor(opts, zcaps, L)
        while w is not None and max(z, lam) + w + zfloor + const < best_t:
            caps = [min(c, o.ycap(w)) for o, c in zip(opts, zcaps)]
            got = _min_fill(opts, caps, L)
            if got is not None:
                ls = got[1]
                t = max(max(o.own(l) for o, l in zip(opts, ls)), lam) + max(o.y(l) for o, l in zip(opts, ls)) \
                    + got[0] + const
                if t < best_t:
                    best_t = t
                    best = SplitResult(t, ls, [o.mode(l) == 1 for o, l in zip(opts, ls)])
            nxt = [o.y(c + 1) for o, c, zc in zip(opts, caps, zcaps) if c < zc]
            if not nxt:
                break
            w = min(nxt)
        nxt = [o.own(c + 1) for o, c in zip(opts, zcaps) if o.ok(c + 1)]
        if not nxt or z >= lam and max(z, lam) >= best_t:
            break
        z = min(nxt)
    return best
