"""Everything `--algo auto` needs for one data-parallel size: per-type TP choices, per-kind tables (a kind
is a (chip, tp) pair), and the stage matrices whose bounds levels.py computes.

* `cheap_bounds(spaces)`: a cheap order-free bound for every combination of per-type choices at every dp
  (water level over types, the slowest stage's one layer, the cheapest fill), in one numpy pass.
* `free_rows(rows)`: the order-free stage matrix of some combinations. A type's s stages sit next to each
  other somewhere in the pipeline, so under 1F1B its j-th stage holds at least s - j micro-batches'
  activations; caps at those counts, no end-stage or link costs and the largest drain gap relax every order.
* `order_rows(combo)`: the exact stage matrix of every order of types for one combination.
"""
from __future__ import annotations

from typing import Iterable, cast

import numpy as np

from .bounds import integral_level, water_level_many
from ..schedules.registry import kind
from .costs import CostModel, in_flight
from .space import stage_tp_runs, tp_counts
from .stagekind import StageKind, StageTerms, stage_kinds
from .stageopts import stage_opt


def type_choices(cm: CostModel, dp: int, names: list[str], group_size: int,
                 max_groups: int | None = None) -> tuple[list[list[list[tuple[int, int]]]], bool]:
    """Per type, every TP choice as runs (tp, stages) at dp (stage_tp_runs), with at most `max_groups`
    groups per type (larger groups beyond it); True when that limit made groups larger."""
    out, cut, counts = [], False, tp_counts(cm.model)
    for name in names:
        c, g = cm.cluster.chip(name), group_size
        if max_groups and c.count > g * max_groups:
            g, cut = -(-c.count // max_groups), True
        out.append(stage_tp_runs(c, dp, g, *counts, max_stages=cm.model.layers))
    return out, cut


class DpSpace:
    def __init__(self, cm: CostModel, dp: int, b: int, names: list[str], group_size: int,
                 choices: list[list[list[tuple[int, int]]]] | None = None) -> None:
        """choices: per type, per choice, runs (tp, stages); type_choices(...) when not given."""
        self.cm, self.dp, self.b, self.names = cm, dp, b, names
        self.L = L = cm.model.layers
        self.sched = cm.train.schedule
        self.nmax = max(L, b)
        self.choices = choices if choices is not None else type_choices(cm, dp, names, group_size)[0]
        self.kid: dict[tuple[str, int], int] = {}
        for name, runs_list in zip(names, self.choices):
            for runs in runs_list:
                for t, _ in runs:
                    self.kid.setdefault((name, t), len(self.kid))
        self.ids = list(self.kid)
        self.kinds: list[StageKind] = stage_kinds(cm, self.ids, dp, b, self.nmax)
        self._tables()
        self._emat: np.ndarray | None = None
        self._lmat: np.ndarray | None = None
        self._ends: dict[tuple[bool, bool, int], tuple[np.ndarray, np.ndarray]] = {}
        self._embv: np.ndarray | None = None
        self._kind_chip: np.ndarray | None = None  # _tie_cols' per-kind columns: chip type, tp, chips per node
        self._kind_tp = self._kind_node = np.zeros(0, dtype=np.int64)
        self._nflight: dict[int, np.ndarray] = {}
        self._flights = np.zeros((0, 0), dtype=np.int64)  # _flight_grid's table: (p, r) -> in-flight count
        self._runs: dict[int, np.ndarray] = {}
        self._mmax: np.ndarray | None = None  # the kinds' mmax rows (_caps_free)
        self._free: dict[int, list[float]] = {}  # _caps_free's per run length
        self.defers = kind(self.sched).defers_weight_grads  # weight passes off the drain chain (no drain gaps)

    @staticmethod
    def _pad(v: Iterable[float], x: float) -> np.ndarray:
        """A per-kind column with the padding kind's value `x` last."""
        return np.array(list(v) + [x], dtype=np.float64)

    def _tables(self) -> None:
        """Per-kind columns with a padding kind last (index len(kinds))."""
        ks, cm, dp = self.kinds, self.cm, self.dp
        pad = self._pad
        self.A, self.A1 = pad((k.own_floor for k in ks), np.inf), pad((k.own[1] for k in ks), np.inf)
        self.BETA, self.UPS = pad((k.fill[0] for k in ks), 0.0), pad((k.upd for k in ks), 0.0)
        self.BWD = pad((cm.coef(c, t, False, dp).bwd for c, t in self.ids), 0.0)
        z = np.zeros((1, self.nmax + 1))
        self.M0 = np.vstack([k.m0 for k in ks] + [z]) if ks else z
        self.M1 = np.vstack([k.m1 for k in ks] + [z]) if ks else z
        # per type and choice: slot kind ids (padded) and the stage's place from the type's end
        self.slots = []
        self.seqs: list[list[np.ndarray]] = []  # per type and choice: the stages' kind ids
        for name, runs_list in zip(self.names, self.choices):
            width = max((sum(s for _, s in r) for r in runs_list), default=0)
            kid = np.full((len(runs_list), width), len(ks), dtype=np.int64)
            rel = np.zeros((len(runs_list), width), dtype=np.int64)
            lens = []
            for i, runs in enumerate(runs_list):
                seq = [self.kid[(name, t)] for t, s in runs for _ in range(s)]
                kid[i, :len(seq)] = seq
                rel[i, :len(seq)] = np.arange(len(seq), 0, -1)
                lens.append(len(seq))
            self.slots.append((kid, rel))
            self.seqs.append([kid[i, :n] for i, n in enumerate(lens)])

    def stages(self, combo: np.ndarray) -> int:
        """The stage count of a combination (rows of choice indices: one per type)."""
        return sum(len(self.seqs[i][c]) for i, c in enumerate(combo.tolist()))

    def stage_counts(self, idx: np.ndarray) -> np.ndarray:
        """The stage count of each combination (rows of choice indices)."""
        out = np.zeros(len(idx), dtype=np.int64)
        for i, seqs in enumerate(self.seqs):
            out += np.array([len(q) for q in seqs], dtype=np.int64)[idx[:, i]]
        return out

    # --- the cheap bound over all combinations --------------------------------------------------------
    def _run_flight(self, s: int) -> np.ndarray:
        """In-flight counts of a run of s stages at the end of an s-stage pipeline: the fewest any longer
        pipeline gives them (the registry's counts do not fall as the pipeline grows or the run moves up)."""
        got = self._runs.get(s)
        if got is None:
            got = self._runs[s] = np.array([in_flight(self.sched, s - r, s, self.b) for r in range(1, s + 1)])
        return got

    def _caps_free(self, s: int) -> list[float]:
        """Per kind, the most layers a run of s stages holds at _run_flight(s)'s counts, every kind in one
        gather (the layer counts are whole numbers: their sum is exact in any order)."""
        got = self._free.get(s)
        if got is None:
            if self._mmax is None:
                self._mmax = np.vstack([k.mmax for k in self.kinds])
            got = self._free[s] = self._mmax[:, self._run_flight(s)].sum(axis=1).tolist()
        return got

    def run_width(self) -> int:
        """The most runs of one TP size in any choice."""
        return max((len(r) for rl in self.choices for r in rl), default=1)

    def combo_terms(self, width: int | None = None) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """The combinations (rows of choice indices) and the per-type inputs of their cheap bound (runs
        padded to `width` per type)."""
        per_type: list[np.ndarray] = []
        runs_of: list[np.ndarray] = []
        width = width or self.run_width()
        # per kind as plain floats (a choice's row is a few Python sums over its runs' kinds)
        own = [k.own_floor for k in self.kinds]
        fill = [k.fill[0] for k in self.kinds]
        one = [k.one_layer(1) for k in self.kinds]
        for name, runs_list in zip(self.names, self.choices):
            rows: list[tuple[float, ...]] = []
            rr = np.zeros((len(runs_list), width, 3))
            rr[:, :, 0] = np.inf
            for i, runs in enumerate(runs_list):
                kds = [(self.kid[(name, t)], s) for t, s in runs]
                cf = [self._caps_free(s)[k] for k, s in kds]
                rows.append((sum(s / own[k] for k, s in kds), sum(cf),
                             min(fill[k] for k, _ in kds), sum(s for _, s in kds),
                             sum(s * fill[k] for k, s in kds), max(one[k] for k, _ in kds)))
                rr[i, :len(kds)] = [(own[k], s, c) for (k, s), c in zip(kds, cf)]
            per_type.append(np.array(rows, dtype=np.float64).reshape(-1, 6))
            runs_of.append(rr)
        sizes = [len(r) for r in per_type]
        if 0 in sizes:
            return np.zeros((0, len(sizes)), dtype=np.int64), {}
        idx = np.indices(sizes).reshape(len(sizes), -1).T
        cols = [per_type[i][idx[:, i]] for i in range(len(per_type))]

        def get(j: int) -> np.ndarray:
            return np.stack([c[:, j] for c in cols], axis=1)

        run_cols = np.concatenate([runs_of[i][idx[:, i]] for i in range(len(per_type))], axis=1)
        return idx, dict(rate=get(0), cap=get(1), bmin=get(2), stages=get(3).sum(axis=1), fill=get(4), one=get(5),
                         runs=run_cols)

    # --- stage matrices ---------------------------------------------------------------------------------
    def lmat(self) -> np.ndarray:
        """Message latency between every pair of kinds (padding: 0); it lengthens drain gaps."""
        if self._lmat is None:
            n = len(self.ids)
            self._lmat = np.zeros((n + 1, n + 1))
            for i, (a, _) in enumerate(self.ids):
                for j, (b, _) in enumerate(self.ids):
                    self._lmat[i, j] = self.cm.latency(a, b)
        return self._lmat

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

    def _gather(self, kid: np.ndarray, n: np.ndarray) -> dict[str, np.ndarray]:
        real = kid < len(self.kinds)
        n = np.minimum(n, self.nmax)
        return dict(a=self.A[kid], a1=self.A1[kid], m0=self.M0[kid, n], m1=self.M1[kid, n], beta=self.BETA[kid],
                    ups=self.UPS[kid], real=real)

    def free_rows(self, idx: np.ndarray) -> StageTerms:
        kid = np.concatenate([self.slots[i][0][idx[:, i]] for i in range(len(self.names))], axis=1)
        rel = np.concatenate([self.slots[i][1][idx[:, i]] for i in range(len(self.names))], axis=1)
        real = kid < len(self.kinds)
        cols = real.any(axis=0)  # padding columns of every row carry nothing
        kid, rel, real = kid[:, cols], rel[:, cols], real[:, cols]
        p = real.sum(axis=1)
        n = self._flight_grid(np.broadcast_to(p.reshape(-1, 1), kid.shape), rel)
        g = self._gather(kid, np.where(real, n, 0))
        # the largest drain gap any order could give (every other stage's one-layer backward and a boundary)
        dmax = 0.0 if self.defers else (np.where(real, self.BWD[kid], 0.0).sum(axis=1)
                                                 + (p - 1) * float((self.emat() + self.lmat()).max()))
        zero = np.zeros(kid.shape)
        y0 = np.where(real, -np.broadcast_to(np.asarray(dmax, dtype=np.float64).reshape(-1, 1), kid.shape), 0.0)
        return StageTerms(a0=zero, y0=y0, lam=np.full(len(p), -np.inf), const=np.zeros(len(p)), **g)

    def _flight_grid(self, p: np.ndarray, rel: np.ndarray) -> np.ndarray:
        """The registry's in-flight count of the stage `rel` from the end of a `p`-stage pipeline, per cell,
        from a table of the pairs asked for so far (each evaluated once: a few dozen, over all passes)."""
        r = np.maximum(rel, 1)
        need = max(int(p.max(initial=0)), int(r.max(initial=1))) + 1
        if len(self._flights) < need:  # -1: not evaluated yet
            grown = np.full((need, need), -1, dtype=np.int64)
            grown[:len(self._flights), :len(self._flights)] = self._flights
            self._flights = grown
        vals = self._flights[p, r]
        miss = vals < 0
        if miss.any():
            # (p, r) as one integer: a 1-d unique (unique over axis 1 sorts rows)
            for q in np.unique(p[miss] * need + r[miss]).tolist():
                self._flights[q // need, q % need] = in_flight(self.sched, q // need - q % need, q // need, self.b)
            vals = self._flights[p, r]
        return cast(np.ndarray, vals)

    def _emb(self) -> np.ndarray:
        """The embedding's backward share of every kind (on the first stage's drain gap)."""
        if self._embv is None:
            self._embv = np.array([2 * self.cm.end(c, t, self.dp, "first").time / 3 for c, t in self.ids])
        return self._embv

    def _end_cols(self, kid: np.ndarray, n: int, first: bool, last: bool) -> np.ndarray:
        """(a0, y0, m0, m1, b0) of an end stage for each kind in kid, from a table per slot filled per kind
        on first use: the orders of many combinations repeat them (one gather instead of a loop)."""
        got = self._ends.get((first, last, n))
        if got is None:
            got = self._ends[(first, last, n)] = (np.zeros((len(self.ids), 5)), np.zeros(len(self.ids), dtype=bool))
        tab, have = got
        if not have[kid].all():
            for k in np.unique(kid[~have[kid]]).tolist():
                o = stage_opt(self.cm, *self.ids[k], self.dp, self.b, n, first, last)
                tab[k] = (o.a0, o.y0, o.m0, o.m1, o.b0)
                have[k] = True
        return cast(np.ndarray, tab[kid].T)

    def _tie_cols(self, kid: np.ndarray) -> np.ndarray:
        """A tied embedding's sum on each row's end stages (CostModel.tie_update), per distinct pair of end
        kinds and node sharing (a row of one chip type whose ranks fit in one of its nodes)."""
        if self._kind_chip is None:
            names = sorted({c for c, _ in self.ids})
            self._kind_chip = np.array([names.index(c) for c, _ in self.ids])
            self._kind_tp = np.array([t for _, t in self.ids])
            self._kind_node = np.array([self.cm.cluster.chip(c).chips_per_node for c, _ in self.ids])
        chip, ranks = self._kind_chip[kid], self._kind_tp[kid] * self.dp
        one_type = (chip == chip[:, :1]).all(axis=1)
        # node sharing as a code: 0 unknown (types differ), 1 spread over nodes, 2 in one node
        code = np.where(one_type, 1 + (ranks.sum(axis=1) <= self._kind_node[kid[:, 0]]), 0)
        k = len(self.ids)
        key = (kid[:, 0] * k + kid[:, -1]) * 3 + code
        uniq, back = np.unique(key, return_inverse=True)
        vals = np.empty(len(uniq))
        for i, q in enumerate(uniq.tolist()):
            pair, c = divmod(q, 3)
            first, last = self.ids[pair // k], self.ids[pair % k]
            vals[i] = self.cm.tie_of(((first[0], first[1] * self.dp), (last[0], last[1] * self.dp)),
                                     None if c == 0 else c == 2)
        return cast(np.ndarray, vals[back.reshape(-1)])

    def order_rows(self, combo: np.ndarray, orders: list[tuple[int, ...]]) -> StageTerms:
        """Exact stage matrix of each order of types (rows), end stages and links included."""
        b = self.b
        parts = [self.seqs[i][c] for i, c in enumerate(combo.tolist())]
        kid = np.concatenate([parts[i] for o in orders for i in o]).reshape(len(orders), -1)
        R, p = kid.shape
        n = self._nflight.get(p)
        if n is None:
            n = self._nflight[p] = np.array([in_flight(self.sched, j, p, b) for j in range(p)])
        g = self._gather(kid, n)  # n (p,) broadcasts against kid (R, p)
        a0, y0 = np.zeros((R, p)), np.zeros((R, p))
        const = np.zeros(R)
        e = self.emat()[kid[:, :-1], kid[:, 1:]]
        for j, first, last in ((0, True, True),) if p == 1 else ((0, True, False), (p - 1, False, True)):
            a0[:, j], y0[:, j], g["m0"][:, j], g["m1"][:, j], b0 = self._end_cols(kid[:, j], int(n[j]), first, last)
            const += b0
        if p > 1 and self.cm.prices_tie:
            tie = self._tie_cols(kid)
            y0[:, 0] += tie
            y0[:, -1] += tie
        if self.defers:
            gaps = np.zeros((R, p))
        else:
            step = self.BWD[kid[:, :-1]] + e + self.lmat()[kid[:, :-1], kid[:, 1:]]
            if p > 1:  # a lone stage has no drain gap to extend
                step[:, 0] += self._emb()[kid[:, 0]]
            gaps = np.concatenate([np.zeros((R, 1)), step.cumsum(axis=1)], axis=1)
        lam = (b * e - 2 * e).max(axis=1) if p > 1 else np.full(R, -np.inf)
        return StageTerms(a0=a0, y0=y0 - gaps, lam=lam, const=const + 2 * e.sum(axis=1), **g)


def cheap_bounds(spaces: list[DpSpace]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per space, the cheap bound of every combination and the combinations (rows of choice indices),
    the numpy passes over all dps' combinations at once (per-dp passes of a few hundred rows are mostly
    call overhead). Rows are independent: stacking changes no value."""
    widths = [sp.run_width() for sp in spaces]
    if spaces and len(spaces[0].names) * max(widths) < 8:  # row sums of fewer than 8 terms run in order:
        widths = [max(widths)] * len(spaces)  # padding them with zeros changes no value, saves a pass
    terms = [sp.combo_terms(w) for sp, w in zip(spaces, widths)]
    out: list[tuple[np.ndarray, np.ndarray]] = [(np.zeros(0), idx) for idx, _ in terms]
    by_w: dict[int, list[int]] = {}
    for i, (_, t) in enumerate(terms):
        if t:
            by_w.setdefault(t["runs"].shape[1], []).append(i)
    for group in by_w.values():
        t = {k: np.concatenate([terms[i][1][k] for i in group]) for k in terms[group[0]][1]}
        L, runs, stages = spaces[group[0]].L, t["runs"], t["stages"]
        with np.errstate(invalid="ignore"):
            z = water_level_many(t["rate"], t["cap"], L)
            z[stages > L] = np.inf  # never a plan (lb is inf below): no integral steps for them
            z = integral_level(runs[..., 0], runs[..., 1], runs[..., 2], z, L)
            lb = np.maximum(z, t["one"].max(axis=1)) + t["fill"].sum(axis=1) + t["bmin"].min(axis=1) * (L - stages)
        lb[stages > L] = np.inf
        at = 0
        for i in group:
            n = len(terms[i][0])
            out[i], at = (lb[at:at + n], terms[i][0]), at + n
    return out
