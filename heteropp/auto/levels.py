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

fill(Z) + W(Z) depends on Z only through the caps, so a level whose caps equal a level already
evaluated (the previous grid level, or the high end of the segment being halved) takes its value, and W
is skipped where the fill is already infinite; the values are the same, the numpy work about a third less.
"""
from __future__ import annotations

import math
from enum import IntEnum
from typing import cast

import numpy as np

from .stagekind import StageTerms

EPS = 1e-9  # caps are rounded up at floating-point ties: a bound may only be optimistic
GRID = 4
REFINE = 10


Fields = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # level_fields: bpoff, slr, rate, yoff, one


def level_fields(slope: np.ndarray, off: np.ndarray, real: np.ndarray) -> Fields:
    """The caps-free inputs of `level` for stages with val_k(l) = off_k + slope_k * l: breakpoint offset
    (padding sorts first), slope, rate and offset over the slope where the slope is positive, and each
    row's one-layer level."""
    pos = real & (slope > 0)
    sl = np.where(pos, slope, 1.0)
    rate = np.where(pos, 1.0 / sl, 0.0)
    one = np.max(np.where(real, off + np.maximum(slope, 0.0), -np.inf), axis=-1)
    return np.where(real, off, -1e30), np.where(pos, sl, 0.0), rate, np.where(pos, off * rate, 0.0), one


def level(caps: np.ndarray, bpoff: np.ndarray, slr: np.ndarray, rate: np.ndarray, yoff: np.ndarray,
          one: np.ndarray, lacks: np.ndarray, L: int) -> np.ndarray:
    """Least x with sum_k min(caps_k, (x - off_k) / slope_k) >= L and x >= off_k + slope_k (one layer each),
    for g levels of R rows at once: caps (R, g, n), the fields of level_fields broadcast against them
    (rate and yoff (R, 1, n) or (R, g, n)), one and lacks (R, g); inf where the caps cannot hold L or a
    stage lacks room for one layer. From the breakpoints in sorted order: caps, rates and offsets summed
    up to each give the layers held there."""
    R, g, n = caps.shape
    offs = (np.arange(R * g) * n).reshape(R, g, 1)  # row-major position of each (row, level)
    bp = bpoff + caps * slr
    o = bp.argsort(axis=2)  # methods, not the np.* wrappers: many small calls
    o += offs
    bp = bp.ravel()[o]
    cum = np.empty((3, R, g, n))
    caps.take(o, out=cum[0])
    if rate.shape[1] != g:  # one per row: positions in the fields
        o -= offs
        o += (np.arange(R) * n).reshape(R, 1, 1)
    rate.take(o, out=cum[1])
    yoff.take(o, out=cum[2])
    cum.cumsum(axis=3, out=cum)
    cum_c, cum_r, cum_y = cum
    rt, yt = cum_r[:, :, -1:], cum_y[:, :, -1:]
    s = cum_c + bp * (rt - cum_r) - (yt - cum_y)
    hit = s >= L - 1e-9
    j = hit.argmax(axis=2)
    at = offs[:, :, 0] + j  # (row, level)'s slot j, row-major
    prev = np.where(j > 0, cum.reshape(3, -1)[:, at - 1], 0.0)  # the sums before slot j
    x = (L - prev[0] + (yt[:, :, 0] - prev[2])) / (rt[:, :, 0] - prev[1])
    bpj = bp.ravel()[at]
    x = np.where(np.isfinite(x), x, bpj)  # all rates spent: the level is the breakpoint itself
    x = np.minimum(x, bpj)
    x = np.maximum(x, one)
    return np.where(~hit.any(axis=2) | lacks, np.inf, x)  # any: hit at j


class Slot(IntEnum):
    """The per-slot fields of a row block, in the order Pass.of stacks them: the own cost's offset and
    per-layer slopes (without, with recompute), the most layers (without, with recompute), the padding
    mark, the update level's terms (level's bpoff, slr, rate, yoff, in that order), and the fill share."""
    A0 = 0
    A = 1
    A1 = 2
    M0 = 3
    M1 = 4
    PAD = 5
    BPOFF = 6
    SLR = 7
    RATE = 8
    YOFF = 9
    BS = 10


class Pass:
    """A row block's per-slot fields (one array: taking rows for a pass is one gather) and the parts of
    the fill and the update level that do not depend on the caps (shared by every pass of the block).
    A pass evaluates g levels per row at once: caps (R, g, n) against fields (R, 1, n), so the grid's
    levels need no copies of the rows."""

    def __init__(self, s: np.ndarray, v: np.ndarray, order: np.ndarray, L: int, a0: bool) -> None:
        self.s, self.v, self.L = s[:, :, None, :], v[:, :, None], L  # slots (field, row, 1, slot); rows
        self.order = order[:, None, :]  # fill order of the slots
        self.a0 = a0  # any own offset (order rows' end stages); free rows have none
        self._at: dict[int, np.ndarray] = {}  # per number of levels: flat positions of the slots in fill order

    @classmethod
    def of(cls, r: StageTerms, L: int, upd: Fields) -> "Pass":
        """upd: level_fields of the update terms."""
        order = np.argsort(np.where(r.real, r.beta, np.inf), axis=1)  # slots cheapest fill first
        flat = order + (np.arange(len(order)) * order.shape[1])[:, None]
        p = r.real.sum(axis=1)
        bpoff, slr, rate, yoff, one = upd
        # padding never lacks a layer; a row with more stages than layers always does
        pad = np.where(r.real, np.where((p > L)[:, None], -np.inf, 0.0), np.inf)
        fields = {Slot.A0: r.a0, Slot.A: r.a, Slot.A1: r.a1, Slot.M0: r.m0, Slot.M1: r.m1, Slot.PAD: pad,
                  Slot.BPOFF: bpoff, Slot.SLR: slr, Slot.RATE: rate, Slot.YOFF: yoff, Slot.BS: r.beta.ravel()[flat]}
        s = np.stack([fields[f] for f in Slot])
        v = np.stack(((L - p).astype(np.float64), np.where(r.real, r.beta, 0.0).sum(axis=1), one, r.const))
        return cls(s, v, order, L, bool(r.a0.any()))

    def take(self, rows: np.ndarray) -> "Pass":
        return Pass(self.s[:, rows, 0], self.v[:, rows, 0], self.order[rows, 0], self.L, self.a0)

    def zcaps(self, z: np.ndarray) -> np.ndarray:
        """Most layers per stage with own <= z (levels z (R, g), finite; padding slots get 0)."""
        s = self.s
        t = z[:, :, None] - s[Slot.A0] if self.a0 else z[:, :, None]
        c0 = np.floor(t / s[Slot.A] + EPS)
        np.minimum(c0, s[Slot.M0], out=c0)
        c1 = np.floor(t / s[Slot.A1] + EPS)
        np.minimum(c1, s[Slot.M1], out=c1)
        cap = np.where(c1 > s[Slot.M0], c1, c0)
        return cast(np.ndarray, np.maximum(cap, 0.0, out=cap))

    def fill(self, caps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Least fill under per-stage caps (R, g, n): every stage takes a layer, the rest go to the
        cheapest first (inf where the caps cannot hold the layers), and which (row, level) has a stage
        without room for one layer."""
        s, lp = self.s, self.v[0]
        R, g, n = caps.shape
        lacks = (caps + s[Slot.PAD]).min(axis=2) < 1
        at = self._at.get(g)
        if at is None:  # reused by a refinement's passes while its rows stay open
            at = self._at[g] = self.order + (np.arange(R * g) * n).reshape(R, g, 1)
        room = np.maximum(caps - 1, 0.0).ravel()[at]
        cum = room.cumsum(2)
        take = lp[:, :, None] - (cum - room)
        np.minimum(np.maximum(take, 0.0, out=take), room, out=take)
        f = self.v[1] + (s[Slot.BS] * take).sum(axis=2)
        return np.where((cum[:, :, -1] < lp) | lacks, np.inf, f), lacks

    def rest(self, caps: np.ndarray, known: np.ndarray | None = None) -> np.ndarray:
        """Least fill + least update level + constants under per-stage caps (R, g, n). The update level
        only where the fill is finite (about half of a grid's levels are below the least feasible
        fill: the sum is inf there whatever it is) and not `known` (the caller has the value of the
        same caps; inf comes back there)."""
        s, v = self.s, self.v
        f, lacks = self.fill(caps)
        live = np.isfinite(f)
        if known is not None:
            live &= ~known
        k = np.count_nonzero(live)
        if k >= 0.9 * f.size:  # too few to skip to pay for the copies
            return cast(np.ndarray, f + level(caps, s[Slot.BPOFF], s[Slot.SLR], s[Slot.RATE], s[Slot.YOFF], v[2],
                                              lacks, self.L) + v[3])
        w = np.empty(f.shape)
        w.fill(np.inf)
        if k:
            rows, at = live.nonzero()
            w[rows, at] = level(caps[rows, at][:, None], s[Slot.BPOFF, rows], s[Slot.SLR, rows],
                                s[Slot.RATE, rows], s[Slot.YOFF, rows], v[2][rows], lacks[rows, at][:, None],
                                self.L)[:, 0]
        return cast(np.ndarray, f + w + v[3])


def lower_bound(r: StageTerms, L: int, best: float, refine: int = REFINE) -> np.ndarray:
    """Per row, a lower bound on the cost of every split (see the module doc). Rows whose bound is still
    below `best` get their least segment halved, `refine` times."""
    # the fields of the own terms and of the update terms in one pass (elementwise: the same values as
    # two passes), (R, 2, n): own first
    both = level_fields(np.stack((r.a, r.ups), axis=1), np.stack((r.a0, r.y0), axis=1), r.real[:, None])
    ps = Pass.of(r, L, (both[0][:, 1], both[1][:, 1], both[2][:, 1], both[3][:, 1], both[4][:, 1]))
    full = full_of(r)[:, None, :]
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        f_inf, lacks = ps.fill(full)
        # the least bottleneck level z0 (own slopes) and the least update level, both at full caps, as
        # the two levels of one level pass
        lv = level(np.broadcast_to(full, (len(r.lam), 2, full.shape[2])), both[0], both[1], both[2], both[3],
                   both[4], np.stack(((r.real & (full[:, 0] < 1)).any(axis=1), lacks[:, 0]), axis=1), L)
        one_own = np.where(r.m0 >= 1, r.a, r.a1)
        z0 = np.maximum(lv[:, 0], np.max(np.where(r.real, r.a0 + one_own, -np.inf), axis=1))
        return _segments(r, ps, z0, f_inf[:, 0] + lv[:, 1] + r.const, best, refine)


def _segments(r: StageTerms, ps: Pass, z0: np.ndarray, f_inf: np.ndarray, best: float, refine: int) -> np.ndarray:
    """The grid over [z0, zhi) and its refinement (module doc); f_inf: the rest at unbounded caps."""
    ok = np.isfinite(z0) & np.isfinite(f_inf)
    zhi = np.where(ok, best - f_inf, z0) if math.isfinite(best) else z0 * 1.05
    zhi = np.where(ok, np.maximum(zhi, z0), z0)
    zs = np.where(ok, z0, 0.0)
    width = np.where(ok, zhi - z0, 0.0) / GRID  # rows without a level are dropped by `ok`
    R = len(zs)
    # segments' low end, high end and the rest at the high end (one array: one gather or store per
    # halving); room for the refined segments up front (one column per halving, inf = no segment)
    seg = np.full((3, R, GRID + refine), np.inf)
    lo, hi, fh = seg
    lo[:, :GRID] = zs[:, None] + width[:, None] * np.arange(GRID)
    hi[:, :GRID] = lo[:, :GRID] + width[:, None]
    # the grid's levels in one pass (per-call overhead dominates)
    caps = ps.zcaps(hi[:, :GRID])
    same = np.zeros((R, GRID), dtype=bool)  # caps equal to the previous level's (a third of them)
    same[:, 1:] = (caps[:, 1:] == caps[:, :-1]).all(axis=2)
    fh[:, :GRID] = ps.rest(caps, same)
    for g in range(1, GRID):
        fh[:, g] = np.where(same[:, g], fh[:, g - 1], fh[:, g])
    fh[~ok] = np.inf  # rows without a level never refine (their bound is inf)
    tail = np.maximum(zhi, r.lam) + f_inf  # levels at or above zhi
    lam = r.lam[:, None]
    # A halving only raises a row's bound, so a row whose bound reaches `best` stays closed: its bound is
    # final then, and the loop goes on with copies of the open rows only (narrowed when rows close).
    out = np.empty(R)
    rows, pa = np.arange(R), ps
    for w in range(GRID, GRID + refine):
        sb = np.maximum(seg[0], lam)
        sb += seg[2]
        cur = np.minimum(sb.min(axis=1), tail)  # never -inf: every term is finite or inf
        open_ = cur < best
        if not open_.all():
            out[rows] = cur
            keep = open_.nonzero()[0]
            if not len(keep):
                break
            rows, seg, sb, lam, tail, pa = rows[keep], seg[:, keep], sb[keep], lam[keep], tail[keep], pa.take(keep)
        at = np.arange(len(rows))
        j = sb.argmin(axis=1)
        lo, h, fhj = seg[:, at, j]
        m = (lo + h) / 2
        # F(m) is F(h) wherever no stage's cap changes in between (nearly half the halvings): the same
        # caps give the same value
        mh = np.empty((len(m), 2))  # not np.stack: its Python overhead counts in this loop
        mh[:, 0], mh[:, 1] = m, h
        caps = pa.zcaps(mh)
        same = (caps[:, 0] == caps[:, 1]).all(axis=1)
        if same.all():  # about one halving in five: no pass at all
            fm = fhj
        else:
            fm = np.where(same, fhj, pa.rest(caps[:, :1], same[:, None])[:, 0])
        # [lo, m) is bounded by F(m); [m, h) keeps F(h)
        seg[:, :, w] = m, h, fhj
        seg[1:, at, j] = m, fm
    else:
        sb = np.maximum(seg[0], lam) + seg[2]
        out[rows] = np.minimum(sb.min(axis=1), tail)
    return np.where(ok, out, np.inf)


WASTE = 512  # padding cells a row block may add to a wider block's pass (times 1 + refine: a refined
# pass has more fixed cost) rather than take a pass of its own


def bound_parts(parts: list[StageTerms], L: int, best: float, refine: int = REFINE) -> np.ndarray:
    """lower_bound of row blocks of different widths, in one pass per group of similar widths: padding a
    narrow block to a much wider one costs more than a pass's overhead. Rows come back in the parts' order."""
    by_w = sorted(range(len(parts)), key=lambda i: -parts[i].a.shape[1])
    groups: list[list[int]] = []
    for i in by_w:
        if groups and (parts[groups[-1][0]].a.shape[1] - parts[i].a.shape[1]) * len(parts[i].lam) <= WASTE * (
            1 + refine
        ):
            groups[-1].append(i)
        else:
            groups.append([i])
    out: list[np.ndarray] = [np.empty(0)] * len(parts)
    for g in groups:
        v = lower_bound(concat([parts[i] for i in g]), L, best, refine)
        at = 0
        for i in g:
            n = len(parts[i].lam)
            out[i], at = v[at:at + n], at + n
    return np.concatenate(out)


def full_of(r: StageTerms) -> np.ndarray:
    return np.where(r.real, np.maximum(r.m0, r.m1), 0.0)


_PAD = dict(a=np.inf, a1=np.inf, a0=0.0, m0=0.0, m1=0.0, beta=0.0, ups=0.0, y0=0.0, real=False)


def concat(parts: list[StageTerms]) -> StageTerms:
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
    return StageTerms(**out)
