"""The one description of a stage kind, a (chip, tp) pair at a dp with b micro-batches per replica, that the
search's bounds (bounds.py, dpspace.py) and its exact layer split (stageopts.py) both read: per-layer costs
with recompute off and on, and the most layers an interior stage of the kind holds with n micro-batches
in flight (a division, tabulated once for every n). StageTerms is a stage of a sequence in the form the
split and the bounds take: its costs as linear functions of its layer count."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from .costs import CostModel, StageCoef


@dataclass(frozen=True)
class StageKind:
    chip: str
    tp: int
    own: tuple[float, float]  # steady-state cost per layer (b * tau - beta), recompute off / on
    fill: tuple[float, float]  # fill/drain share per layer, recompute off / on
    upd: float  # gradient sync and optimizer step per layer
    m0: np.ndarray = field(repr=False)  # m0[n]: most layers with n in flight, recompute off
    m1: np.ndarray = field(repr=False)  # the same with recompute on
    mmax: np.ndarray = field(repr=False)  # the larger of the two
    cum: np.ndarray = field(repr=False)  # cum[n] = mmax[1] + ... + mmax[n] (in-flight counts 1..n)

    @property
    def own_floor(self) -> float:
        """The steady-state cost per layer, recompute off, kept positive for the bounds' divisions."""
        return max(self.own[0], 1e-300)

    def one_layer(self, n: int) -> float:
        """Least steady-state cost of a stage (it holds a layer or more) with n in flight; inf if none fits."""
        return self.own_floor if self.m0[n] >= 1 else self.own[1] if self.mmax[n] >= 1 else math.inf


def _col(v: list[float]) -> np.ndarray:
    """A column of float64s, one row per stage kind."""
    return np.array(v, dtype=np.float64).reshape(-1, 1)


def stage_kinds(cm: CostModel, ids: list[tuple[str, int]], dp: int, b: int, pmax: int) -> list[StageKind]:
    """The StageKind of every (chip, tp) in ids, the memory tables of all of them in one go."""
    c0s = [cm.coef(chip, tp, False, dp) for chip, tp in ids]
    c1s = [cm.coef(chip, tp, True, dp) for chip, tp in ids]
    room = _col([cm.cluster.chip(chip).usable_bytes for chip, _ in ids])
    n = np.arange(pmax + 1, dtype=np.float64)
    m0, m1 = (np.floor(np.maximum(room - _col([c.transient for c in cs]), 0.0)
                       / (_col([c.static for c in cs]) + n * _col([c.act for c in cs]))) for cs in (c0s, c1s))
    m0[:, 0] = m1[:, 0] = 0.0  # closed form of CostModel.max_layers for interior stages
    m = np.maximum(m0, m1)
    cum = np.cumsum(m, axis=1)
    return [StageKind(chip, tp, *_per_layer(c0, c1, b), m0=m0[i], m1=m1[i], mmax=m[i], cum=cum[i])
            for i, ((chip, tp), c0, c1) in enumerate(zip(ids, c0s, c1s))]


PerLayer = tuple[tuple[float, float], tuple[float, float], float]  # StageKind's own, fill and upd


def per_layer(cm: CostModel, chip: str, tp: int, dp: int, b: int) -> PerLayer:
    """A kind's StageKind.own, fill and upd, without its memory tables (stageopts.py reads only these)."""
    return _per_layer(cm.coef(chip, tp, False, dp), cm.coef(chip, tp, True, dp), b)


def _per_layer(c0: StageCoef, c1: StageCoef, b: int) -> PerLayer:
    """own (b * tau - beta), fill (beta), recompute off / on, and upd of the coefficients without and with
    recompute."""
    return (b * c0.tau - c0.beta, b * c1.tau - c1.beta), (c0.beta, c1.beta), c0.upd


@dataclass(frozen=True)
class StageTerms:
    """A stage's terms with l layers: own(l) = a0 + a_r l (steady state), fill(l) = b0 + beta_r l (fill and
    drain share), y(l) = y0 + ups l (update, less the drain gap), where r is recompute: off (a, beta) while
    l <= m0, on (a1, beta1) up to m1. Python numbers for one stage of one sequence (split.py; the methods),
    or arrays of rows x slots for many sequences at once (levels.py, dpspace.py), which also carry which
    slots are stages (`real`; padding slots: a = inf, zero caps), each row's link term `lam` and constant
    `const` (the end stages' b0 and the boundaries), and relax recompute's fill to beta (b0, beta1 None)."""
    a0: Any
    a: Any
    a1: Any
    m0: Any
    m1: Any
    beta: Any
    ups: Any = 0.0
    y0: Any = 0.0
    b0: Any = None
    beta1: Any = None
    real: Any = None
    lam: Any = None
    const: Any = None

    # the methods read one stage's Python numbers (the fields are Any for the array form): cast, not converted
    def mode(self, nl: int) -> int:
        return 0 if nl <= self.m0 else 1

    def ok(self, nl: int) -> bool:
        return cast(bool, nl <= self.m0 or nl <= self.m1)

    def own(self, nl: int) -> float:
        return cast(float, self.a0 + (self.a if nl <= self.m0 else self.a1) * nl)

    def phi(self, nl: int) -> float:
        return cast(float, self.b0 + (self.beta if nl <= self.m0 else self.beta1) * nl)

    def y(self, nl: int) -> float:
        return cast(float, self.y0 + self.ups * nl)

    @property
    def lmax(self) -> int:
        return cast(int, max(self.m0, self.m1))

    def cap(self, z: float) -> int:
        """Most layers with own <= z (0 when not even one)."""
        c0 = self.m0 if self.a <= 0 else min(self.m0, math.floor((z - self.a0) / self.a + 1e-12))
        if c0 >= self.m0 and self.m1 > self.m0:
            c1 = self.m1 if self.a1 <= 0 else min(self.m1, math.floor((z - self.a0) / self.a1 + 1e-12))
            if c1 > self.m0:
                return cast(int, c1)
        return cast(int, max(c0, 0))

    def ycap(self, w: float) -> int:
        """Most layers with y <= w (a division: y is linear)."""
        if self.ups <= 0:
            return self.lmax if w >= self.y0 - 1e-12 else 0
        return cast(int, max(0, math.floor((w - self.y0) / self.ups + 1e-12)))
