"""A lower bound on the best split of many stage sequences at once (rows of a padded matrix, numpy).

A split's cost is max(Z, Lambda) + W + fill + C with Z = max_k own_k(l_k), W = max_k y_k(l_k) and
fill = sum_k phi_k(l_k). At bottleneck level Z a stage holds at most cap_k(Z) layers (integral, recompute
when the layers do not fit without it), and both the least fill and the least W under those caps only
grow as Z falls. So for levels g_0 < ... < g_K (g_0 the least feasible level), every split with Z in
[g_i, g_i+1) costs at least max(g_i, Lambda) + fill(g_i+1) + W(g_i+1) + C, and one with Z >= g_K at least
max(g_K, Lambda) + fill(inf) + W(inf) + C; the least of these bounds every split. g_K is placed where the
last term reaches the best plan so far, so the grid covers only levels that could still beat it. fill(Z)
is the greedy over the caps in order of per-layer fill cost (every stage takes a layer), W(Z) a water
level; both relax recompute's higher per-layer cost (a lower bound stays one).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

EPS = 1e-9  # caps are rounded up at floating-point ties: a bound may only be optimistic
GRID = 4
REFINE = 10


@dataclass
class Rows:
    """Stage slots per row; padding slots have real False, a = inf and zero caps."""
    a: np.ndarray  # own slope, recompute off
    a1: np.ndarray  # own slope, recompute on
    a0: np.ndarray  # own offset (embedding or head)
    m0: np.ndarray  # most layers, recompute off
    m1: np.ndarray  # most layers, recompute on
    beta: np.ndarray  # fill slope, recompute off
    ups: np.ndarray  # update slope
    y0: np.ndarray  # update offset (end stages' extra update, minus the drain gap)
    real: np.ndarray
    lam: np.ndarray  # (R,) link term
    const: np.ndarray  # (R,) fill offsets and link fill

    def take(self, rows: np.ndarray) -> "Rows":
        return Rows(**{k: v[rows] for k, v in self.__dict__.items()})


def zcaps(r: Rows, z: np.ndarray) -> np.ndarray:
    """Most layers per stage with own <= z (rows' levels z)."""
    z = z[:, None]
    with np.errstate(invalid="ignore", divide="ignore"):
        c0 = np.minimum(np.floor((z - r.a0) / r.a + EPS), r.m0)
        c1 = np.minimum(np.floor((z - r.a0) / r.a1 + EPS), r.m1)
    cap = np.where(c1 > r.m0, c1, c0)
    return np.where(r.real, np.maximum(cap, 0.0), 0.0)


def level_terms(slope: np.ndarray, off: np.ndarray, real: np.ndarray) -> tuple:
    """The parts of `level` that do not depend on the caps (a bound pass reuses them for every level)."""
    pos = real & (slope > 0)
    sl = np.where(pos, slope, 1.0)
    rate = np.where(pos, 1.0 / sl, 0.0)
    yoff = np.where(pos, off * rate, 0.0)
    one = np.max(np.where(real, off + np.maximum(slope, 0.0), -np.inf), axis=1)
    return pos, sl, rate, yoff, off, real, one


def level(c: np.ndarray, slope: np.ndarray, off: np.ndarray, real: np.ndarray, L: int,
          terms: tuple | None = None) -> np.ndarray:
    """Least x with sum_k min(c_k, (x - off_k) / slope_k) >= L and x >= off_k + slope_k (one layer each);
    inf where the caps cannot hold L (or a stage not even one)."""
    pos, sl, rate, yoff, off, real, one = terms or level_terms(slope, off, real)
    cc = np.where(real, c, 0.0)
    bp = np.where(real, np.where(pos, off + cc * sl, off), -1e30)
    o = np.argsort(bp, axis=1)
    o += (np.arange(len(o)) * o.shape[1])[:, None]
    bp = bp.ravel()[o]
    # caps, rates and offsets gathered and summed in one go (a leading 0 column: the sums before slot j)
    R, n = o.shape
    cum = np.zeros((3, R, n + 1))
    cum[:, :, 1:] = np.stack((cc, rate, yoff)).reshape(3, -1)[:, o]
    np.cumsum(cum, axis=2, out=cum)
    cum_c, cum_r, cum_y = cum[:, :, 1:]
    rt, yt = cum_r[:, -1:], cum_y[:, -1:]
    with np.errstate(over="ignore", invalid="ignore"):
        s = cum_c + bp * (rt - cum_r) - (yt - cum_y)
    hit = s >= L - 1e-9
    j = np.argmax(hit, axis=1)
    rows = np.arange(len(j))
    prev_c, prev_r, prev_y = cum[:, rows, j]
    with np.errstate(divide="ignore", invalid="ignore"):
        x = (L - prev_c + (yt[:, 0] - prev_y)) / (rt[:, 0] - prev_r)
    x = np.where(np.isfinite(x), x, bp[rows, j])  # all rates spent: the level is the breakpoint itself
    x = np.minimum(x, bp[rows, j])
    x = np.maximum(x, one)
    bad = ~hit.any(axis=1) | (real & (c < 1)).any(axis=1)
    return np.where(bad, np.inf, x)


def fill_terms(r: Rows) -> tuple:
    """The parts of `fill` that do not depend on the caps: slots cheapest first, stage counts, their
    per-layer fill in that order, and the fill of one layer each."""
    order = np.argsort(np.where(r.real, r.beta, np.inf), axis=1)
    flat = order + (np.arange(len(order)) * order.shape[1])[:, None]
    return order, r.real.sum(axis=1), r.beta.ravel()[flat], np.where(r.real, r.beta, 0.0).sum(axis=1)


def fill(r: Rows, caps: np.ndarray, L: int, terms: tuple | None = None) -> np.ndarray:
    """Least sum of per-layer fill under caps (every stage one layer, the rest to the cheapest first)."""
    order, p, bs, base = terms or fill_terms(r)
    flat = order + (np.arange(len(order)) * order.shape[1])[:, None]  # row-major positions, cheapest first
    room = np.maximum(caps - 1, 0.0).ravel()[flat]
    cum = np.cumsum(room, 1)
    take = np.clip((L - p)[:, None] - (cum - room), 0.0, room)
    out = base + (bs * take).sum(axis=1)
    bad = (cum[:, -1] < L - p) | (r.real & (caps < 1)).any(axis=1) | (p > L)
    return np.where(bad, np.inf, out)


def lower_bound(r: Rows, L: int, best: float, refine: int = REFINE) -> np.ndarray:
    """Per row, a lower bound on the cost of every split (see the module doc). Rows whose bound is still
    below `best` get their least segment halved, `refine` times."""
    one_own = np.where(r.m0 >= 1, r.a, r.a1)
    z0 = level(np.maximum(r.m0, r.m1), r.a, r.a0, r.real, L)
    z0 = np.maximum(z0, np.max(np.where(r.real, r.a0 + one_own, -np.inf), axis=1))

    def rest(rr: Rows, z: np.ndarray | None, t: tuple) -> np.ndarray:
        caps = full_of(rr) if z is None else zcaps(rr, z)
        return fill(rr, caps, L, t[:4]) + level(caps, rr.ups, rr.y0, rr.real, L, t[4:]) + rr.const

    # the caps-free parts of the fill and the update level, shared by every pass (rows taken as needed)
    terms = fill_terms(r) + level_terms(r.ups, r.y0, r.real)
    f_inf = rest(r, None, terms)
    ok = np.isfinite(z0) & np.isfinite(f_inf)
    zhi = np.where(ok, best - f_inf, z0) if math.isfinite(best) else z0 * 1.05
    zhi = np.where(ok, np.maximum(zhi, z0), z0)
    zs = np.where(ok, z0, 0.0)
    with np.errstate(invalid="ignore"):  # rows without a level are dropped by `ok`
        width = np.where(ok, zhi - z0, 0.0) / GRID
    R = len(zs)
    # room for the refined segments up front (one column per halving, inf = no segment)
    lo = np.full((R, GRID + refine), np.inf)
    hi, fh = lo.copy(), lo.copy()
    lo[:, :GRID] = zs[:, None] + width[:, None] * np.arange(GRID)
    hi[:, :GRID] = lo[:, :GRID] + width[:, None]
    # the grid's levels in one pass over rows repeated GRID times (per-call overhead dominates)
    rep = np.repeat(np.arange(R), GRID)
    fh[:, :GRID] = rest(r.take(rep), hi[:, :GRID].ravel(), tuple(t[rep] for t in terms)).reshape(R, GRID)
    tail = np.maximum(zhi, r.lam) + f_inf  # levels at or above zhi
    for w in range(GRID, GRID + refine):
        sb = np.maximum(lo, r.lam[:, None]) + fh
        cur = np.minimum(sb.min(axis=1), tail)
        act = np.flatnonzero(ok & (cur < best) & np.isfinite(cur))
        if not len(act):
            break
        j = np.argmin(sb[act], axis=1)
        l, h = lo[act, j], hi[act, j]
        m = (l + h) / 2
        if len(act) == R:  # every row still open: no copies
            fm = rest(r, m, terms)
        else:
            fm = rest(r.take(act), m, tuple(t[act] for t in terms))
        # [l, m) is bounded by F(m); [m, h) keeps F(h)
        lo[act, w], hi[act, w], fh[act, w] = m, h, fh[act, j]
        hi[act, j], fh[act, j] = m, fm
    sb = np.maximum(lo, r.lam[:, None]) + fh
    return np.where(ok, np.minimum(sb.min(axis=1), tail), np.inf)


WASTE = 512  # padding cells a row block may add to a wider block's pass (times 1 + refine: a refined
# pass has more fixed cost) rather than take a pass of its own


def bound_parts(parts: list[Rows], L: int, best: float, refine: int = REFINE) -> np.ndarray:
    """lower_bound of row blocks of different widths, in one pass per group of similar widths: padding a
    narrow block to a much wider one costs more than a pass's overhead. Rows come back in the parts' order."""
    by_w = sorted(range(len(parts)), key=lambda i: -parts[i].a.shape[1])
    groups: list[list[int]] = []
    for i in by_w:
        if groups and (parts[groups[-1][0]].a.shape[1] - parts[i].a.shape[1]) * len(parts[i].lam) <= WASTE * (1 + refine):
            groups[-1].append(i)
        else:
            groups.append([i])
    out: list = [None] * len(parts)
    for g in groups:
        v = lower_bound(concat([parts[i] for i in g]), L, best, refine)
        at = 0
        for i in g:
            n = len(parts[i].lam)
            out[i], at = v[at:at + n], at + n
    return np.concatenate(out)


def full_of(r: Rows) -> np.ndarray:
    return np.where(r.real, np.maximum(r.m0, r.m1), 0.0)


_PAD = dict(a=np.inf, a1=np.inf, a0=0.0, m0=0.0, m1=0.0, beta=0.0, ups=0.0, y0=0.0, real=False)


def concat(parts: list[Rows]) -> Rows:
    """Stack row blocks of different widths into one matrix (padding slots carry nothing), so that one
    numpy pass bounds them all: the per-call overhead dominates on blocks of a few dozen rows."""
    if len(parts) == 1:
        return parts[0]
    w = max(p.a.shape[1] for p in parts)
    n = sum(len(p.lam) for p in parts)
    out = {}
    for k, v in _PAD.items():
        m = np.full((n, w), v, dtype=bool if k == "real" else np.float64)
        at = 0
        for p in parts:
            x = getattr(p, k)
            m[at:at + len(x), :x.shape[1]] = x
            at += len(x)
        out[k] = m
    out["lam"] = np.concatenate([p.lam for p in parts])
    out["const"] = np.concatenate([p.const for p in parts])
    return Rows(**out)
