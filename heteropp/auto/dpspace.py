"""Everything `--algo auto` needs for one data-parallel size: per-type TP choices, per-kind tables (a kind
is a (chip, tp) pair), and the stage matrices whose bounds levels.py computes.

* `combos()`: a cheap order-free bound for every combination of per-type choices (water level over
  types, the slowest stage's one layer, the cheapest fill).
* `free_rows(rows)`: the order-free stage matrix of some combinations. A type's s stages sit next to each
  other somewhere in the pipeline, so under 1F1B its j-th stage holds at least s - j micro-batches'
  activations; caps at those counts, no end-stage or link costs and the largest drain gap relax every order.
* `order_rows(combo)`: the exact stage matrix of every order of types for one combination.
"""
from __future__ import annotations

import itertools

import numpy as np

from .bounds import Kind, integral_level, make_kind, water_level_many
from .costs import CostModel, in_flight
from .levels import Rows
from .space import heads_gcd, stage_tp_choices


class DpSpace:
    def __init__(self, cm: CostModel, dp: int, b: int, names: list[str], group_size: int) -> None:
        self.cm, self.dp, self.b, self.names = cm, dp, b, names
        self.L = L = cm.model.layers
        self.sched = cm.train.schedule
        self.nmax = max(L, b)
        self.choices: list[list[list[tuple[int, int]]]] = []  # per type, per choice: runs (tp, stages)
        for name in names:
            runs = []
            for ts in stage_tp_choices(cm.cluster.chip(name), dp, group_size, heads_gcd(cm)):
                if len(ts) <= L:
                    runs.append([(t, len(list(g))) for t, g in itertools.groupby(ts)])
            self.choices.append(runs)
        self.kid: dict[tuple[str, int], int] = {}
        self.kinds: list[Kind] = []
        for name, runs_list in zip(names, self.choices):
            for runs in runs_list:
                for t, _ in runs:
                    if (name, t) not in self.kid:
                        self.kid[(name, t)] = len(self.kinds)
                        self.kinds.append(make_kind(cm, name, t, dp, b, self.nmax))
        self.ids = [k for k, _ in sorted(self.kid.items(), key=lambda x: x[1])]
        self._tables()
        self._emat: np.ndarray | None = None
        self._ends: dict = {}
        self._embs: dict = {}

    def _tables(self) -> None:
        """Per-kind columns with a padding kind last (index len(kinds))."""
        ks, cm, dp = self.kinds, self.cm, self.dp
        pad = lambda v, x: np.array(list(v) + [x], dtype=np.float64)  # noqa: E731
        self.A, self.A1 = pad((k.a for k in ks), np.inf), pad((k.a1 for k in ks), np.inf)
        self.BETA, self.UPS = pad((k.beta for k in ks), 0.0), pad((k.upd for k in ks), 0.0)
        self.BWD = pad((cm.coef(c, t, False, dp).bwd for c, t in self.ids), 0.0)
        z = np.zeros((1, self.nmax + 1))
        self.M0 = np.vstack([k.m0 for k in ks] + [z]) if ks else z
        self.M1 = np.vstack([k.m1 for k in ks] + [z]) if ks else z
        # per type and choice: slot kind ids (padded) and the stage's place from the type's end
        self.slots = []
        for name, runs_list in zip(self.names, self.choices):
            width = max((sum(s for _, s in r) for r in runs_list), default=0)
            kid = np.full((len(runs_list), width), len(ks), dtype=np.int64)
            rel = np.zeros((len(runs_list), width), dtype=np.int64)
            for i, runs in enumerate(runs_list):
                seq = [self.kid[(name, t)] for t, s in runs for _ in range(s)]
                kid[i, :len(seq)] = seq
                rel[i, :len(seq)] = np.arange(len(seq), 0, -1)
            self.slots.append((kid, rel))

    # --- the cheap bound over all combinations --------------------------------------------------------
    def _upto(self, kd: Kind, x: int) -> float:
        return float(kd.cum[min(x, self.b)]) + max(x - self.b, 0) * float(kd.mmax[self.b])

    def _cap_free(self, kd: Kind, s: int) -> float:
        if self.sched == "1f1b":
            return self._upto(kd, s)
        return s * float(kd.mmax[self.b if self.sched == "gpipe" else min(s, self.b)])

    def combos(self) -> tuple[np.ndarray, np.ndarray]:
        """Order-free lower bound of every combination, and the combinations (rows of choice indices)."""
        L, per_type, runs_of = self.L, [], []
        width = max((len(r) for rl in self.choices for r in rl), default=1)
        for name, runs_list in zip(self.names, self.choices):
            rows, rr = [], np.zeros((len(runs_list), width, 3))
            rr[:, :, 0] = np.inf
            for i, runs in enumerate(runs_list):
                kds = [(self.kinds[self.kid[(name, t)]], s) for t, s in runs]
                rows.append((sum(s / k.a for k, s in kds), sum(self._cap_free(k, s) for k, s in kds),
                             min(k.beta for k, _ in kds), sum(s for _, s in kds), sum(s * k.beta for k, s in kds),
                             max(k.one_layer(1) for k, _ in kds)))
                for j, (k, s) in enumerate(kds):
                    rr[i, j] = (k.a, s, self._cap_free(k, s))
            per_type.append(np.array(rows, dtype=np.float64).reshape(-1, 6))
            runs_of.append(rr)
        sizes = [len(r) for r in per_type]
        if 0 in sizes:
            return np.zeros(0), np.zeros((0, len(sizes)), dtype=np.int64)
        idx = np.indices(sizes).reshape(len(sizes), -1).T
        cols = [per_type[i][idx[:, i]] for i in range(len(per_type))]
        get = lambda j: np.stack([c[:, j] for c in cols], axis=1)  # noqa: E731
        stages = get(3).sum(axis=1)
        runs = np.concatenate([runs_of[i][idx[:, i]] for i in range(len(per_type))], axis=1)
        with np.errstate(invalid="ignore"):
            z = integral_level(runs[..., 0], runs[..., 1], runs[..., 2], water_level_many(get(0), get(1), L), L)
            lb = np.maximum(z, get(5).max(axis=1)) + get(4).sum(axis=1) + get(2).min(axis=1) * (L - stages)
        lb[stages > L] = np.inf
        return lb, idx

    # --- stage matrices ---------------------------------------------------------------------------------
    def emat(self) -> np.ndarray:
        """Boundary time between every pair of kinds (padding: 0)."""
        if self._emat is None:
            n = len(self.ids)
            e = np.zeros((n + 1, n + 1))
            for i, (a, ta) in enumerate(self.ids):
                for j, (b, tb) in enumerate(self.ids):
                    e[i, j] = self.cm.boundary(a, ta, b, tb, self.dp)
            self._emat = e
        return self._emat

    def _gather(self, kid: np.ndarray, n: np.ndarray) -> dict:
        real = kid < len(self.kinds)
        n = np.minimum(n, self.nmax)
        return dict(a=self.A[kid], a1=self.A1[kid], m0=self.M0[kid, n], m1=self.M1[kid, n], beta=self.BETA[kid],
                    ups=self.UPS[kid], real=real)

    def free_rows(self, idx: np.ndarray) -> Rows:
        kid = np.concatenate([self.slots[i][0][idx[:, i]] for i in range(len(self.names))], axis=1)
        rel = np.concatenate([self.slots[i][1][idx[:, i]] for i in range(len(self.names))], axis=1)
        real = kid < len(self.kinds)
        cols = real.any(axis=0)  # padding columns of every row carry nothing
        kid, rel, real = kid[:, cols], rel[:, cols], real[:, cols]
        p = real.sum(axis=1)
        if self.sched == "1f1b":
            n = np.minimum(rel, self.b)
        else:  # GPipe: b everywhere; ZB-H1: min(p, b)
            n = np.broadcast_to(np.minimum(p if self.sched == "zbh1" else self.b, self.b).reshape(-1, 1), kid.shape)
        g = self._gather(kid, np.where(real, n, 0))
        # the largest drain gap any order could give (every other stage's one-layer backward and a boundary)
        dmax = 0.0 if self.sched == "zbh1" else (np.where(real, self.BWD[kid], 0.0).sum(axis=1)
                                                 + (p - 1) * float(self.emat().max()))
        zero = np.zeros(kid.shape)
        y0 = np.where(real, -np.broadcast_to(np.asarray(dmax, dtype=np.float64).reshape(-1, 1), kid.shape), 0.0)
        return Rows(a0=zero, y0=y0, lam=np.full(len(p), -np.inf), const=np.zeros(len(p)), **g)

    def _emb(self, k: int) -> float:
        if k not in self._embs:
            self._embs[k] = 2 * self.cm.end(*self.ids[k], self.dp, "first").time / 3
        return self._embs[k]

    def order_rows(self, combo: np.ndarray, orders: list[tuple[int, ...]]) -> Rows:
        """Exact stage matrix of each order of types (rows), end stages and links included."""
        from .search import _opt
        cm, b, dp = self.cm, self.b, self.dp
        seqs = [np.concatenate([self.slots[i][0][combo[i]] for i in o]) for o in orders]
        kid = np.stack([s[s < len(self.kinds)] for s in seqs])
        R, p = kid.shape
        n = np.array([in_flight(self.sched, j, p, b) for j in range(p)])
        g = self._gather(kid, np.broadcast_to(n, kid.shape))
        a0, y0 = np.zeros((R, p)), np.zeros((R, p))
        const = np.zeros(R)
        e = self.emat()[kid[:, :-1], kid[:, 1:]]
        ends = self._ends  # end-stage terms per (kind, slot): orders of many combinations repeat them
        for r in range(R):
            for j in {0, p - 1}:
                key = (int(kid[r, j]), j == 0, j == p - 1, int(n[j]))
                e_ = ends.get(key)
                if e_ is None:
                    o = _opt(cm, *self.ids[key[0]], dp, b, key[3], key[1], key[2])
                    e_ = ends[key] = (o.a0, o.y0, *o.m, o.b0)
                a0[r, j], y0[r, j], g["m0"][r, j], g["m1"][r, j] = e_[:4]
                const[r] += e_[4]
        if self.sched == "zbh1":
            gaps = np.zeros((R, p))
        else:
            step = self.BWD[kid[:, :-1]] + e
            emb = np.array([self._emb(int(k)) for k in kid[:, 0]])
            step[:, 0] += emb
            gaps = np.concatenate([np.zeros((R, 1)), np.cumsum(step, axis=1)], axis=1)
        lam = (b * e - 2 * e).max(axis=1) if p > 1 else np.full(R, -np.inf)
        return Rows(a0=a0, y0=y0 - gaps, lam=lam, const=const + 2 * e.sum(axis=1), **g)

