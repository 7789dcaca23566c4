"""Per-stage-kind tables and the cheap lower bounds that let `--algo auto` skip most configurations.

A stage kind is (chip, tp) at a given dp. Its per-layer steady-state cost a (b * tau - beta, recompute off:
recompute only adds work), fill share beta, and the most layers m(n) a stage can hold with n micro-batches
in flight (a division, tabulated once for every n) bound any split from below:

    every split has l_k <= min(Z / a_k, m(n_k)) at bottleneck level Z, so sum_k min(Z / a_k, m(n_k)) >= L.

The least such Z over chip types (`water_level_many`), the one-layer cost of the slowest stage, plus the
cheapest possible fill is the cheap bound of every combination (dpspace.py). Over one chip type's stages
the in-flight counts are distinct, so m(1) + ... + m(s) bounds its capacity whatever the order of types.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .costs import CostModel


@dataclass(frozen=True)
class Kind:
    a: float  # per-layer steady-state cost, recompute off
    a1: float  # the same with recompute on
    beta: float  # per-layer fill/drain share, recompute off
    upd: float  # per-layer update time
    cum: np.ndarray  # cum[n] = m(1) + ... + m(n) (in-flight counts 1..n)
    mmax: np.ndarray  # mmax[n] = most layers with n in flight, recompute on or off
    m0: np.ndarray  # m0[n] = the same with recompute off
    m1: np.ndarray  # m1[n] = the same with recompute on

    def one_layer(self, n: int) -> float:
        """Least steady-state cost of a stage (it holds a layer or more) with n in flight; inf if none fits."""
        return self.a if self.m0[n] >= 1 else self.a1 if self.mmax[n] >= 1 else math.inf


def make_kinds(cm: CostModel, ids: list[tuple[str, int]], dp: int, b: int, pmax: int) -> list[Kind]:
    """The Kind of every (chip, tp) in ids, the memory tables of all of them in one go."""
    c0s = [cm.coef(chip, tp, False, dp) for chip, tp in ids]
    c1s = [cm.coef(chip, tp, True, dp) for chip, tp in ids]
    col = lambda v: np.array(v, dtype=np.float64).reshape(-1, 1)  # noqa: E731
    room = col([cm.cluster.chip(chip).usable_bytes for chip, _ in ids])
    n = np.arange(pmax + 1, dtype=np.float64)
    m0, m1 = (np.floor(np.maximum(room - col([c.transient for c in cs]), 0.0)
                       / (col([c.static for c in cs]) + n * col([c.act for c in cs]))) for cs in (c0s, c1s))
    m0[:, 0] = m1[:, 0] = 0.0  # closed form of CostModel.max_layers for interior stages
    m = np.maximum(m0, m1)
    cum = np.cumsum(m, axis=1)
    return [Kind(a=max(b * c0.tau - c0.beta, 1e-300), a1=b * c1.tau - c1.beta, beta=c0.beta, upd=c0.upd,
                 cum=cum[i], mmax=m[i], m0=m0[i], m1=m1[i]) for i, (c0, c1) in enumerate(zip(c0s, c1s))]


def water_level_many(rates: np.ndarray, caps: np.ndarray, L: int) -> np.ndarray:
    """water_level for many configurations at once: rows are configurations, columns entities. The level is
    max over proper subsets S of (L - caps_S) / rates_(not S) (a sum of mins is the min over subsets)."""
    n = rates.shape[1]
    z = np.zeros(rates.shape[0])
    for mask in range(1 << n):
        inside = np.array([(mask >> i) & 1 for i in range(n)], dtype=bool)
        if inside.all():
            continue
        num = L - caps[:, inside].sum(axis=1)
        z = np.maximum(z, num / rates[:, ~inside].sum(axis=1))
    z[caps.sum(axis=1) < L] = np.inf
    return z


def integral_level(a: np.ndarray, s: np.ndarray, cap: np.ndarray, z: np.ndarray, L: int,
                   steps: int = 32) -> np.ndarray:
    """Raise the water levels z (rows) to the least level where whole layers fit: a run of s stages with
    per-layer cost a holds at most min(s * floor(Z / a), cap) layers at bottleneck level Z (end stages
    only add a non-negative offset). Steps from breakpoint to breakpoint; a row still short after `steps`
    keeps its level, which then still bounds from below."""
    z = z.copy()
    act = np.flatnonzero(np.isfinite(z))
    aa, ss, cc, zz = a[act], s[act], cap[act], z[act]  # the rows still short, carried from step to step
    with np.errstate(invalid="ignore", divide="ignore"):
        for _ in range(steps):
            if not len(act):
                break
            # in place where a temporary would only be thrown away: thousands of rows, the same arithmetic
            f = np.divide(zz[:, None], aa)
            f += 1e-9
            np.floor(f, out=f)
            sf = ss * f
            short = np.minimum(sf, cc).sum(axis=1) < L - 1e-9
            if not short.all():
                act, f, sf, zz = act[short], f[short], sf[short], zz[short]
                aa, ss, cc = aa[short], ss[short], cc[short]
            f += 1
            f *= aa
            f[~(sf < cc)] = np.inf
            zz = np.maximum(zz, f.min(axis=1))
            z[act] = zz
    return z
