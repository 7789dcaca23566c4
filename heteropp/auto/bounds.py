"""The cheap lower bounds that let `--algo auto` skip most configurations.

A stage kind (stagekind.StageKind: (chip, tp) at a given dp) has a per-layer steady-state cost a (b * tau -
beta, recompute off: recompute only adds work), a fill share beta, and the most layers m(n) a stage can
hold with n micro-batches in flight; they bound any split from below:

    every split has l_k <= min(Z / a_k, m(n_k)) at bottleneck level Z, so sum_k min(Z / a_k, m(n_k)) >= L.

The least such Z over chip types (`water_level_many`), the one-layer cost of the slowest stage, plus the
cheapest possible fill is the cheap bound of every combination (dpspace.py). Over one chip type's stages
the in-flight counts are distinct, so m(1) + ... + m(s) bounds its capacity whatever the order of types.
"""
from __future__ import annotations

import numpy as np


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
