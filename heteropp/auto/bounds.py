"""Per-stage-kind tables and the cheap lower bounds that let `--algo auto` skip most configurations.

A stage kind is (chip, tp) at a given dp. Its per-layer steady-state cost a (b * tau - beta, recompute off:
recompute only adds work), fill share beta, and the most layers m(n) a stage can hold with n micro-batches
in flight (a division, tabulated once for every n) bound any split from below:

    every split has l_k <= min(Z / a_k, m(n_k)) at bottleneck level Z, so sum_k min(Z / a_k, m(n_k)) >= L.

The least such Z (a water level over segments of identical stages, solved at the breakpoints), and the
one-layer cost of the slowest stage (every stage holds a layer), plus the cheapest possible fill (every
stage's one layer, the rest at the cheapest share) is a lower bound on T. Over one chip type's stages the in-flight counts are distinct,
so m(1) + ... + m(s) bounds its capacity whatever the order of types; with the order fixed the exact
counts are used.
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

    def one_layer(self, n: int) -> float:
        """Least steady-state cost of a stage (it holds a layer or more) with n in flight; inf if none fits."""
        return self.a if self.m0[n] >= 1 else self.a1 if self.mmax[n] >= 1 else math.inf


def make_kind(cm: CostModel, chip: str, tp: int, dp: int, b: int, pmax: int) -> Kind:
    c0, c1 = cm.coef(chip, tp, False, dp), cm.coef(chip, tp, True, dp)
    room = cm.cluster.chip(chip).usable_bytes
    n = np.arange(pmax + 1, dtype=np.float64)
    m0, m1 = (np.floor(np.maximum(room - c.transient, 0.0) / (c.static + n * c.act)) for c in (c0, c1))
    m0[0] = m1[0] = 0.0  # closed form of CostModel.max_layers for interior stages
    m = np.maximum(m0, m1)
    return Kind(a=max(b * c0.tau - c0.beta, 1e-300), a1=b * c1.tau - c1.beta, beta=c0.beta, upd=c0.upd,
                cum=np.cumsum(m), mmax=m, m0=m0)


def water_level(rates: list[float], caps: list[float], L: int) -> float:
    """Least Z with sum_i min(rates_i * Z, caps_i) >= L (inf when the caps cannot hold L)."""
    if sum(caps) < L:
        return math.inf
    order = sorted(range(len(rates)), key=lambda i: caps[i] / rates[i])
    r, sat = sum(rates), 0.0
    for i in order:
        z = (L - sat) / r
        if z <= caps[i] / rates[i]:
            return z
        sat += caps[i]
        r -= rates[i]
    return 0.0


def integral_level(z: float, kinds: list[tuple[float, int, float]], L: int) -> float:
    """Raise a fractional level z to the least Z >= z with sum_i min(s_i * floor(Z / a_i), cap_i) >= L for
    runs (a_i, s_i, cap_i) of identical stages: a stage at level Z holds at most floor(Z / a) layers."""
    if not math.isfinite(z):
        return z
    for _ in range(4 * L):
        if sum(min(s * math.floor(z / a + 1e-9), c) for a, s, c in kinds) >= L:
            return z
        z = min(a * (math.floor(z / a + 1e-9) + 1) for a, s, c in kinds if s * math.floor(z / a + 1e-9) < c)
    return z


def update_level(ups: list[float], gaps: list[float], L: int) -> float:
    """Least max_k (ups_k * l_k - gaps_k) over splits with every l_k >= 1 (fractional, so a lower bound)."""
    one = max(u - g for u, g in zip(ups, gaps))
    if min(ups) <= 0:
        return one
    return max(one, (L - sum(g / u for u, g in zip(ups, gaps))) / sum(1 / u for u in ups))


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


def fill_floor(betas: list[float], counts: list[int], L: int) -> float:
    """Every stage adds one layer's share (betas[i] for counts[i] stages), the other layers the cheapest."""
    p = sum(counts)
    return sum(b * c for b, c in zip(betas, counts)) + (L - p) * min(betas)
