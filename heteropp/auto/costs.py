"""The cost and memory model that scores every plan (both search algorithms' outputs are judged by it).

Per micro-batch, stage k costs c_k = l_k * (fwd + bwd + r_k * recompute) (+ embedding on the first stage,
+ head on the last). With b micro-batches per replica, update time u_k and boundary transfer e_j:

    F = max( max_k [b c_k - beta_k],  max_j [b e_j - 2 e_j] ) + sum_k beta_k + 2 sum_j e_j
    T = F + max_k (u_k - D_k)

F is when the pipeline's compute ends (beta_k is stage k's share of fill and drain: c_k under 1F1B and
GPipe, the paper's alpha = 1; c_k minus its deferred weight-gradient work under ZB-H1). Stage k runs its
update u_k after its own last backward, which under 1F1B and GPipe precedes stage 0's last backward by at
least D_k = sum_{j<k} (one layer's backward of stage j + e_j) (every stage holds a layer or more); under
ZB-H1 D_k = 0. The paper adds u_k to stage k's own term only, max_k(b c_k + u_k + sum_{j != k} c_j), which
under-counts a large update on a non-bottleneck stage. A boundary is a pipeline resource too: per
direction it carries one activation (or gradient) per micro-batch and adds its latency to fill and drain.

With `round_trips` (the estimate a plan reports; the search's objective leaves this out) schedules that
alternate forwards and backwards replace the steady-state term by the chains of alternating.py (a stage's
timeline and the round trips, warm-up and drain at their real length), and the whole passes through the
pipeline as flow shops (pass_term) join the max, which is what fill and drain cost at few micro-batches
(exact for GPipe). Under ZB-H1 the update term then becomes max_k (L_k + h_k w_k + u_k) - F, with L_k the
chains' bound on stage k's last backward (alternating.last_backward_ends) and h_k w_k the held-back weight
passes that follow it. A schedule that neither alternates nor runs whole passes (interleaved 1F1B) is
priced with round trips by the longest chains of its actions, each link's queue in turn (chains.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

from ..spec import Cluster, InfeasibleError, ModelSpec, TrainSpec
from ..spec.placement import StageBlock, place
from ..schedules.registry import kind
from .alternating import last_backward_ends, round_trip_bound, stage_bound
from .chains import chain_bound
from .analytic import ring_allgather_s, ring_allreduce_s
from .profiles import Profile
from .simulator import StageTimes


@dataclass(frozen=True)
class StageCoef:
    """Per-layer coefficients of one stage kind (chip, tp, recompute) at a given dp."""
    tau: float  # compute per micro-batch
    beta: float  # fill/drain share per micro-batch
    upd: float  # gradient sync + optimizer step
    bwd: float  # backward without recompute (a stage's least drain share per layer)
    static: float  # bytes: weights, gradients, optimizer state
    act: float  # bytes saved per micro-batch
    transient: float  # bytes of one layer's full activations during recompute


@dataclass(frozen=True)
class EndCoef:
    """Embedding (first stage) or head (last stage) constants."""
    time: float
    beta: float
    upd: float
    static: float
    transient: float


@dataclass
class StageSpec:
    chip: str
    tp: int
    layers: int
    recompute: bool
    inner_dp: int = 1  # replicas splitting each micro-batch (plan.StagePlan.inner_dp); the search uses 1


def virtual_stages(stages: list[StageSpec], chunks: int) -> list[StageSpec]:
    """Each stage's layers cut into `chunks` contiguous chunks (the later chunks take the remainder, as
    the later stages do), listed in pipeline order: chunk c of stage s is virtual stage c * p + s."""
    out = []
    for c in range(chunks):
        for s in stages:
            base, extra = divmod(s.layers, chunks)
            out.append(replace(s, layers=base + (1 if c >= chunks - extra else 0)))
    return out


@dataclass
class Estimate:
    iteration_time_s: float
    stage_time_s: list[float]  # c_k
    stage_update_s: list[float]
    stage_memory_bytes: list[float]
    stage_capacity_bytes: list[float]
    in_flight: list[int]
    boundary_s: list[float]
    bottleneck: str  # "stage k" or "link k->k+1"
    fill_drain_s: float
    feasible: bool
    details: dict[str, Any] = field(default_factory=dict)


def in_flight(schedule: str, k: int, p: int, b: int) -> int:
    """Micro-batches whose activations stage k holds at its peak (the registry's count, default parameters)."""
    return kind(schedule).in_flight(k, p, b, {})


class CostModel:
    def __init__(self, cluster: Cluster, model: ModelSpec, train: TrainSpec, profile: Profile,
                 holders_elsewhere: int = 0, elsewhere: tuple[float, float | None] | None = None) -> None:
        """`holders_elsewhere`: ranks outside this cluster known to hold every part at each TP shard too, sharing
        its ZeRO-1 optimizer state (a replica group planned alone: one at least in each other group). `elsewhere`:
        the network those holders are reached over, (the slowest network_bw of every group's types, the slowest
        link between this cluster's types and theirs or None), GB/s: given, each part's gradient sync is priced
        as the joined plan runs it (replica_sim), over the holders here and elsewhere at that speed."""
        self.cluster, self.model, self.train, self.profile = cluster, model, train, profile
        self.holders_elsewhere, self.elsewhere = holders_elsewhere, elsewhere
        nb = train.bytes_per_value
        self.act_msg = nb * train.micro_batch_size * model.seq_len * model.hidden  # one boundary activation
        # What heteropp's ZeroAdamW holds per parameter: the weight in the compute dtype and its gradient in
        # fp32 (fp32 accumulation and reduction; the weights and gradients are views of two flat buffers), and
        # in its ZeRO-1 shard the two fp32 Adam moments, plus an fp32 master copy when the weights are bf16/fp16.
        self._param_b, self._opt_b = nb + 4, (12 if nb == 2 else 8)
        # What its data-parallel update sends per parameter: the gradient buffer's element (fp32, or the weights'
        # own dtype when wider) all-reduced, and with ZeRO-1 the updated weight all-gathered in the compute dtype
        self._grad_b, self._weight_b = max(nb, 4), nb
        self._chip = {c.name: c for c in cluster.chips}
        self._listed_nodes = {c.name: c.nodes for c in cluster.chips if c.nodes}  # types the spec lists nodes of
        self.coef = lru_cache(maxsize=None)(self._coef)
        self.end = lru_cache(maxsize=None)(self._end)
        self.boundary = lru_cache(maxsize=None)(self._boundary)
        self.tie_of = lru_cache(maxsize=None)(self._tie_of)
        self.latency = lru_cache(maxsize=None)(cluster.latency_s)  # (chip a, chip b) -> seconds per message
        # asked thousands of times per search with a few dozen distinct arguments (h2's DFS, stage options)
        self.max_layers = lru_cache(maxsize=None)(self._max_layers)
        self.room_terms = lru_cache(maxsize=None)(self._room_of)
        self._layer_params = lru_cache(maxsize=None)(self._one_layer_params)

    def on(self, cluster: Cluster) -> "CostModel":
        """This model's inputs on `cluster`, some of this cluster's chip types at other counts (a baseline's
        sub-cluster). Where the chip specs, other than their counts, and the links and latencies among them
        are this cluster's, the per-kind tables are shared: none of them depends on a count, and a baseline's
        sub-search asks for the same ones again."""
        sub = CostModel(cluster, self.model, self.train, self.profile, self.holders_elsewhere, self.elsewhere)
        names = [c.name for c in cluster.chips]
        same = all(c.name in self._chip and replace(c, count=0) == replace(self._chip[c.name], count=0)
                   for c in cluster.chips) and all(
            cluster.link_bw(a, b) == self.cluster.link_bw(a, b) and cluster.latency_s(a, b) == self.latency(a, b)
            for a in names for b in names)
        if same:
            sub.coef, sub.end, sub.boundary, sub.latency = self.coef, self.end, self.boundary, self.latency
            sub.max_layers, sub.room_terms, sub._layer_params = self.max_layers, self.room_terms, self._layer_params
        return sub

    # --- per-layer coefficients -------------------------------------------------------------------
    def _static_per_param(self, dp: int, zero1: bool) -> float:
        return self._param_b + self._opt_b / (dp + self.holders_elsewhere if zero1 else 1)

    def _grad_sync(self, chip: str, params_per_chip: float, dp: int, tp: int, one_node: bool | None = None,
                   zero1: bool | None = None) -> float:
        """What the engine's optimizer (heteropp/engine/optim.py) sends: the fp32 gradients all-reduced and,
        sharded by ZeRO-1, the updated weights all-gathered in the compute dtype; over the node's own fabric
        when the stage's tp * dp chips fit in one node (ranks are laid out stage by stage), or, given
        `one_node`, when its placement (spec/placement.py) put them in one node."""
        zero1 = self.train.zero1 if zero1 is None else zero1
        bw = self._holder_bw(frozenset((chip,)), chip, tp, dp, one_node)
        if self.elsewhere is not None and self.holders_elsewhere:  # the joined plan's ring, across the groups
            net, link = self.elsewhere
            dp, bw = dp + self.holders_elsewhere, min(net, link / tp if link is not None else net)
        gather = ring_allgather_s(self._weight_b * params_per_chip, dp, bw) if zero1 else 0.0
        return ring_allreduce_s(self._grad_b * params_per_chip, dp, bw) + gather

    def _one_layer_params(self, tp: int) -> float:
        """Weights of one layer on one of `tp` ranks: the profile's whole-layer count, scaled by the model's
        TP-group total over its layer count (replicated key/value heads, whole norms on every rank; a
        measured profile's times already include replication, its parameter count does not), split evenly."""
        return self.profile.layer_params * (self.model.layer_params_tp_group(tp) / self.model.layer_params) / tp

    def _replica_sync(self, chip: str, tp: int) -> float:
        """The engine's all-reduce over the TP group that sums replicated key/value weight gradients once per
        iteration: a slot per distinct key/value head, each one rank's K and V weights of the layer."""
        m = self.model
        if m.kv_replicas(tp) == 1:
            return 0.0
        nbytes = self._grad_b * m.kv_heads * 2 * m.hidden * m.head_dim  # the fp32 gradient buffer's slices
        return ring_allreduce_s(nbytes, tp, self._chip[chip].intra_node_bw)

    def part_update(self, part: int | str, chips: frozenset[str], chip: str, tp: int, ranks: int,
                    one_node: bool | None = None, summed: bool = False) -> float:
        """One rank's update of a layer (`part` its index), "embed" or "head" (with tied embeddings: "embed", the
        head's "copy" of it and the final "norm") whose gradients are reduced over `ranks` ranks per TP shard on
        chip types `chips` (replica groups with different pipelines): the ring all-reduce (one type: as
        _grad_sync prices it, `one_node` whether the placement put every holder in one node where the spec lists
        the type's nodes; several: at the slowest network, an explicit link shared by the tp shards' rings; fp32
        gradients, and with ZeRO-1 the weights all-gathered), its optimizer step (a ZeRO-1 shard among those
        ranks) and, for a layer, the replicated key/value heads' sum. `summed`: the gradient is already summed
        (a tied matrix, by tie_sum), so no all-reduce. replica_sim prices a plan of replica groups with the
        plan's zero1, as the engine runs it."""
        layer, params = self._layer_params(tp), self._part_params(part, tp)
        bw = self._holder_bw(chips, chip, tp, ranks, one_node)
        sync = 0.0 if summed else ring_allreduce_s(self._grad_b * params, ranks, bw)
        if self.train.zero1:
            sync += ring_allgather_s(self._weight_b * params, ranks, bw)
        optim = self.profile.get(chip, tp).optim_s * params / layer / (ranks if self.train.zero1 else 1)
        return sync + optim + (self._replica_sync(chip, tp) if isinstance(part, int) else 0.0)

    def tie_sum(self, chips: frozenset[str], chip: str, ranks: int, one_node: bool | None = None) -> float:
        """The engine's sum of a tied embedding's gradient (engine/tied.py): the whole matrix in fp32, every TP
        slice in place, all-reduced over `ranks`, every rank of every TP group that holds either end."""
        fp32_b = 4.0  # tied.py's buffer, whatever the weights' dtype
        return ring_allreduce_s(fp32_b * self.profile.embed_params, ranks,
                                self._holder_bw(chips, chip, 1, ranks, one_node))

    def tie_update(self, phys: list[StageSpec], dp: int, virtual: int) -> float:
        """A one-list plan's sum of a tied embedding's two copies (engine/topology.py's tie group: every rank of the
        first and of the last stage; engine/tied.py), on each end stage's update; `phys`: the physical stages,
        `virtual`: how many stages the plan lists (more where a schedule interleaves). The sum waits for the
        later end; it is priced on each end as if it began at that end's own finish, which keeps the stages'
        costs separable for the layer split (in 1F1B-like schedules the first stage, which ends last, is
        exact)."""
        if not self.prices_tie or virtual < 2:
            return 0.0
        ends = phys[:1] if len(phys) == 1 else [phys[0], phys[-1]]
        one_node = None  # ranks are laid out stage by stage: one type's ends share a node when all its stages do
        if all(s.chip == phys[0].chip for s in phys):
            one_node = sum(s.tp * dp * s.inner_dp for s in phys) <= self._chip[phys[0].chip].chips_per_node
        return self.tie_of(tuple((s.chip, s.tp * dp * s.inner_dp) for s in ends), one_node)

    @property
    def prices_tie(self) -> bool:
        """Whether a plan of more than one stage pays tie_update: a tied model, save a replica group planned
        alone, whose ends' sync over every group (_grad_sync with `elsewhere`) stands for the joined plan's tie."""
        return self.model.tie_embeddings and not (self.elsewhere is not None and self.holders_elsewhere)

    def _tie_of(self, ends: tuple[tuple[str, int], ...], one_node: bool | None) -> float:
        """tie_update of end stages given as (chip type, ranks) (the search's vectorized orders ask it too)."""
        return self.tie_sum(frozenset(c for c, _ in ends), ends[0][0], sum(r for _, r in ends), one_node)

    def _holder_bw(self, chips: frozenset[str], chip: str, tp: int, ranks: int, one_node: bool | None) -> float:
        """GB/s of a ring over a part's `ranks` holders per TP shard on chip types `chips`: one type, its node's
        fabric where they fit in one node (or `one_node`), else its network; several, the slowest network and
        any explicit link between them, shared by the tp shards' rings."""
        if len(chips) == 1:
            c = self._chip[chip]
            return c.intra_node_bw if (tp * ranks <= c.chips_per_node if one_node is None else one_node) \
                else c.network_bw
        bw = min(self._chip[c].network_bw for c in chips)
        for a in chips:
            for b in chips:
                if a < b and (link := self.cluster.link_bw(a, b)) is not None:
                    bw = min(bw, link / tp)
        return bw

    def _part_params(self, part: int | str, tp: int) -> float:
        """Weights of a layer (`part` its index), "embed", "head" (the output matrix and final norm), a tied
        embedding's "copy" (the head), or its final "norm" (whole on every TP rank) on one of `tp` ranks."""
        if isinstance(part, int):
            return self._layer_params(tp)
        if part == "norm":
            return max(self.profile.head_params - self.profile.embed_params, 0.0)
        return (self.profile.head_params if part == "head" else self.profile.embed_params) / tp

    def part_static(self, part: int | str, tp: int, ranks: int) -> float:
        """One rank's bytes of weights, gradients and optimizer state of a part held by `ranks` ranks per TP shard
        (replica groups; with ZeRO-1 its optimizer state sharded among them, engine/holder_optim.py)."""
        return self._part_params(part, tp) * self._static_per_param(ranks, self.train.zero1)

    def _coef(self, chip: str, tp: int, recompute: bool, dp: int, zero1: bool | None = None,
              schedule: str | None = None) -> StageCoef:
        zero1 = self.train.zero1 if zero1 is None else zero1
        schedule = schedule or self.train.schedule
        pr = self.profile.get(chip, tp)
        tau = pr.fwd_s + pr.bwd_s + (pr.recompute_s if recompute else 0.0)
        beta = tau - pr.wgrad_s if kind(schedule).defers_weight_grads else tau
        params = self._layer_params(tp)
        upd = self._grad_sync(chip, params, dp, tp, zero1=zero1) + pr.optim_s / (dp if zero1 else 1) + \
            self._replica_sync(chip, tp)
        return StageCoef(tau=tau, beta=beta, upd=upd, bwd=pr.bwd_s, static=params * self._static_per_param(dp, zero1),
                         act=pr.ckpt_bytes if recompute else pr.act_bytes,
                         transient=pr.act_bytes if recompute else 0.0)

    def ends(self, chip: str, tp: int, dp: int, first: bool, last: bool, zero1: bool | None = None,
             one_matrix: bool | None = None) -> tuple[EndCoef, ...]:
        """The end parts a stage holds: the embedding (`first`) and the head (`last`). A stage that holds both of a
        tied model (`one_matrix`, default first and last: a lone stage; not an interleaved schedule's, whose first
        and last chunks are two modules) holds the matrix once, as the engine makes the head the embedding's
        parameter: its head end computes the logits but keeps and updates only the final norm."""
        if (first and last if one_matrix is None else one_matrix) and self.model.tie_embeddings:
            return self.end(chip, tp, dp, "first", zero1), self.end(chip, tp, dp, "norm", zero1)
        return tuple(self.end(chip, tp, dp, w, zero1) for f, w in ((first, "first"), (last, "last")) if f)

    def _end(self, chip: str, tp: int, dp: int, which: str, zero1: bool | None = None) -> EndCoef:
        """`which`: "first" (the embedding), "last" (the head and final norm), "norm" (a lone tied stage's head:
        the logits' compute, the final norm's weights)."""
        zero1 = self.train.zero1 if zero1 is None else zero1
        pr = self.profile.get(chip, tp)
        if which == "first":
            params, t, tr = self.profile.embed_params / tp, pr.embed_s, 0.0
        elif which == "norm":  # whole on every TP rank
            params, t, tr = max(self.profile.head_params - self.profile.embed_params, 0.0), pr.head_s, pr.head_act_bytes
        else:
            params, t, tr = self.profile.head_params / tp, pr.head_s, pr.head_act_bytes
        upd = self._grad_sync(chip, params, dp, tp, zero1=zero1) + pr.optim_s * params / self._layer_params(tp) / (
            dp if zero1 else 1
        )
        static = params * self._static_per_param(dp, zero1)
        if which == "last" and self.model.tie_embeddings and self.holders_elsewhere and zero1:
            # a tied head's copy: in the joined plan only the last stages of groups of more than one stage hold
            # it, so a group planned alone counts on none elsewhere sharing its optimizer state
            static += params * self._opt_b * (1 / dp - 1 / (dp + self.holders_elsewhere))
        return EndCoef(time=t, beta=t, upd=upd, static=static, transient=tr)

    def _boundary(self, a: str, ta: int, b: str, tb: int, dp: int) -> float:
        """One activation across a stage boundary: send/recv so each byte crosses once (spread over both TP
        groups' NICs), then an all-gather inside the receiving TP group; an explicit cross-group link is
        shared by all dp replicas."""
        ca, cb = self._chip[a], self._chip[b]
        m = self.act_msg
        t = m / (min(ta * ca.network_bw, tb * cb.network_bw) * 1e9)
        link = self.cluster.link_bw(a, b) if a != b else None
        if link is not None:
            t = max(t, dp * m / (link * 1e9))
        if tb > 1:
            t += (tb - 1) / tb * m / (cb.intra_node_bw * 1e9)
        return t

    # --- memory -----------------------------------------------------------------------------------
    def memory(self, chip: str, tp: int, recompute: bool, dp: int, layers: int, n: int, first: bool, last: bool,
               zero1: bool | None = None, share: float = 1.0, one_matrix: bool | None = None) -> float:
        """`dp`: the stage's replicas (dp x inner_dp); `share`: the part of each micro-batch's rows it holds
        (1 / inner_dp); `one_matrix` as ends'."""
        c = self.coef(chip, tp, recompute, dp, zero1)
        mem = layers * (c.static + n * c.act * share) + c.transient * share
        for e in self.ends(chip, tp, dp, first, last, zero1, one_matrix):
            mem += e.static + e.transient * share
        return mem

    def _max_layers(self, chip: str, tp: int, recompute: bool, dp: int, n: int, first: bool, last: bool,
                    zero1: bool | None = None) -> int:
        """Most layers a stage can hold in memory (0 when not even one fits)."""
        return layers_within(self.room_terms(chip, tp, recompute, dp, first, last, zero1), n)

    def _room_of(self, chip: str, tp: int, recompute: bool, dp: int, first: bool, last: bool,
                 zero1: bool | None) -> tuple[float, float, float]:
        """_max_layers' terms that do not depend on the in-flight count (h2's DFS asks for a thousand
        counts): the memory left beside a stage of no layers, and a layer's static and per-micro-batch bytes."""
        c = self.coef(chip, tp, recompute, dp, zero1)
        return (self._chip[chip].usable_bytes - self.memory(chip, tp, recompute, dp, 0, 0, first, last, zero1),
                c.static, c.act)

    # --- the stages as the simulator runs them ------------------------------------------------------
    def placed_one_node(self, stages: list[StageSpec], dp: int) -> list[bool | None]:
        """Per (physical) stage of a chip type whose nodes the spec lists, whether its placement puts all its
        replicas in one node (None for the other types: the rule of _grad_sync). Raises PlacementError (an
        InfeasibleError) where a TP group fits in no node."""
        listed = self._listed_nodes
        if not listed:
            return [None] * len(stages)
        mine = [k for k, s in enumerate(stages) if s.chip in listed]
        nodes = place(listed, [StageBlock(stages[k].chip, stages[k].tp, dp * stages[k].inner_dp) for k in mine])
        out: list[bool | None] = [None] * len(stages)
        for k, where in zip(mine, nodes):
            out[k] = len(set(where)) == 1
        return out

    @property
    def lists_nodes(self) -> bool:
        """Whether some chip type's spec lists its nodes (then placement decides where gradients sync)."""
        return bool(self._listed_nodes)

    def placed_sync_delta(self, s: StageSpec, sdp: int, one_node: bool, ends: tuple[str, ...]) -> float:
        """What a stage's gradient all-reduces take on its placed nodes beyond what the coefficients charge."""
        params = [(s.layers, self._layer_params(s.tp))]
        params += [(1, (self.profile.embed_params if w == "first" else self.profile.head_params) / s.tp) for w in ends]
        return sum(n * (self._grad_sync(s.chip, q, sdp, s.tp, one_node) - self._grad_sync(s.chip, q, sdp, s.tp))
                   for n, q in params)

    def stage_times(self, stages: list[StageSpec], dp: int, chunks: int = 1) -> tuple[list[StageTimes], list[float]]:
        """Per-stage times and bytes, and per-boundary transfer times. A stage with inner_dp = i computes 1/i
        of every micro-batch (times and activations scaled by 1/i, linear in the rows) and reduces gradients
        over dp * i replicas; its boundaries are priced as if its TP group were i times larger (the
        send/recv spread over i times the NICs; the all-gather is over-counted: it runs in each TP group on
        1/i of the rows). `chunks`: the stages are the virtual stages of an interleaved schedule (the first
        len / chunks are the physical ones). A chip type whose nodes the spec lists has its stages placed
        (spec/placement.py): a stage spread over nodes syncs its gradients over the network."""
        p = len(stages)
        phys = max(p // chunks, 1)
        one_node = self.placed_one_node(stages[:phys], dp)
        out = []
        for k, s in enumerate(stages):
            pr = self.profile.get(s.chip, s.tp)
            sdp, share = dp * s.inner_dp, 1.0 / s.inner_dp
            c = self.coef(s.chip, s.tp, s.recompute, sdp)
            fwd = s.layers * pr.fwd_s * share
            bwd = s.layers * (pr.bwd_s + (pr.recompute_s if s.recompute else 0.0)) * share
            upd = s.layers * c.upd
            static, transient = s.layers * c.static, c.transient * share
            for e in self.ends(s.chip, s.tp, sdp, k == 0, k == p - 1):
                # embedding/head work split 1:2 between forward and backward, none of it deferred
                fwd, bwd, upd = fwd + e.time * share / 3, bwd + 2 * e.time * share / 3, upd + e.upd
                static, transient = static + e.static, transient + e.transient * share
            placed = one_node[k % phys]
            if placed is not None:
                upd += self.placed_sync_delta(s, sdp, placed, tuple(w for f, w in ((k == 0, "first"),
                                                                                     (k == p - 1, "last")) if f))
            out.append(StageTimes(fwd=fwd, bwd=bwd, wgrad=s.layers * pr.wgrad_s * share, update=upd,
                                  static_bytes=static, act_bytes=s.layers * c.act * share, transient_bytes=transient))
        if tie := self.tie_update(stages[:phys], dp, p):
            for k in {0, p - 1}:
                out[k] = replace(out[k], update=out[k].update + tie)
        es = [self.boundary(a.chip, a.tp * a.inner_dp, b.chip, b.tp * b.inner_dp, dp)
              for a, b in zip(stages, stages[1:])]
        return out, es

    # --- the iteration-time formula ----------------------------------------------------------------
    def drain_gaps(self, seq: list[tuple[str, int]], dp: int, schedule: str | None = None) -> list[float]:
        """D_k: how long before stage 0's last backward stage k's last backward has surely finished."""
        schedule = schedule or self.train.schedule
        out = [0.0]
        for k in range(len(seq) - 1):
            if kind(schedule).defers_weight_grads:  # a stage's last actions are weight passes, off the chain
                out.append(0.0)
                continue
            (a, ta), (b_, tb) = seq[k], seq[k + 1]
            d = self.coef(a, ta, False, dp).bwd + self.boundary(a, ta, b_, tb, dp) + self.latency(a, b_)
            if k == 0:
                d += 2 * self.end(a, ta, dp, "first").time / 3  # the embedding's backward share
            out.append(out[-1] + d)
        return out

    @staticmethod
    def pass_term(fs: list[float], bs: list[float], es: list[float], lats: list[float], b: int,
                  spans: list[int]) -> tuple[float, str]:
        """Fill and drain as flow shops of whole passes, a bound the steady-state terms miss at few
        micro-batches. b forwards cross stages and links like identical jobs through a flow shop: one job's
        stage and link times (latency included) plus (b - 1) times the slowest of them. After its last
        forward, stage j still runs spans[j] backwards (its warm-up plus one; all b under GPipe), and each
        must cross every stage and link down to stage 0: a second flow shop. Likewise the first forward's
        chain before a flow shop of all b backwards. `bs`: the backward on the critical chain (the input
        gradient where weight gradients are deferred)."""
        hop = [e + x for e, x in zip(es, lats)]
        best, where = -math.inf, ""
        for j in range(len(fs)):
            all_f = sum(fs[:j + 1]) + sum(hop[:j]) + (b - 1) * max(fs[:j + 1] + es[:j])
            n = min(spans[j], b)
            back = sum(bs[:j + 1]) + sum(hop[:j]) + (n - 1) * max(bs[:j + 1] + es[:j])
            if all_f + back > best:
                best, where = all_f + back, f"passes through stage {j}"
        all_b = sum(bs) + sum(hop) + (b - 1) * max(bs + es)
        if sum(fs) + sum(hop) + all_b > best:
            best, where = sum(fs) + sum(hop) + all_b, "backward pass"
        return best, where

    @staticmethod
    def pass_last_backward(fs: list[float], bs: list[float], es: list[float], lats: list[float], b: int,
                           spans: list[int], ws: list[float] | None = None,
                           held: list[int] | None = None) -> list[float]:
        """pass_term's chains per stage m: b forwards through stages 0..j as a flow shop, then stage j's last
        spans[j] backwards down to stage m as a second one, ending with stage m's last backward. Stage m
        runs those backwards within its drain, so where it defers weight passes (`ws`, `held`: the
        registry's held_weight_passes) the ones it runs between them count there too."""
        hop = [e + x for e, x in zip(es, lats)]
        out = [-math.inf] * len(fs)
        for j in range(len(fs)):
            all_f = sum(fs[:j + 1]) + sum(hop[:j]) + (b - 1) * max(fs[:j + 1] + es[:j])
            n, path, slowest = min(spans[j], b), 0.0, 0.0
            for m in reversed(range(j + 1)):
                path += bs[m] + (hop[m] if m < j else 0.0)
                slowest = max(slowest, bs[m], es[m] if m < j else 0.0)
                own = (n - 1) * bs[m]  # backwards b - n + 1 .. b - 1 on stage m, weight passes between
                if ws is not None and held is not None:
                    own += max(0, b - 1 - max(b - n, held[m])) * ws[m]
                out[m] = max(out[m], all_f + path + max((n - 1) * slowest, own))
        return out

    def evaluate(self, stages: list[StageSpec], dp: int, b: int, schedule: str | None = None,
                 round_trips: bool = False, params: dict[str, Any] | None = None) -> Estimate:
        """`round_trips`: price alternating schedules by the chains of alternating.py instead of the
        steady-state term, and add the whole passes (pass_term): maxima over runs of stages that the
        search's layer split cannot take apart. Without them the estimate is the search's objective.
        `params`: the schedule's (H-1F1B's extra warm-up), which set the in-flight counts."""
        schedule = schedule or self.train.schedule
        p = len(stages)
        lone = p == 1 and kind(schedule).chunks(params or {}) == 1  # interleaved: two chunks, two matrices
        own, beta, cs, us, mems, caps, ns = [], [], [], [], [], [], []
        fs: list[float] = []  # per micro-batch: forward, and the backward on the critical chain (beta - forward)
        bs: list[float] = []
        for k, s in enumerate(stages):
            # inner_dp replicas each compute 1 / inner_dp of every micro-batch and reduce over dp x inner_dp
            sdp, share = dp * s.inner_dp, 1.0 / s.inner_dp
            c = self.coef(s.chip, s.tp, s.recompute, sdp, None, schedule)
            t, bt, u = s.layers * c.tau * share, s.layers * c.beta * share, s.layers * c.upd
            for e in self.ends(s.chip, s.tp, sdp, k == 0, k == p - 1, one_matrix=lone):
                t, bt, u = t + e.time * share, bt + e.beta * share, u + e.upd
            n = kind(schedule).in_flight(k, p, b, params or {})
            f = (self.profile.get(s.chip, s.tp).fwd_s * s.layers + (self.end(s.chip, s.tp, sdp, "first").time / 3
                 if k == 0 else 0.0) + (self.end(s.chip, s.tp, sdp, "last").time / 3 if k == p - 1 else 0.0)) * share
            fs.append(f)
            bs.append(bt - f)
            cs.append(t)
            us.append(u)
            beta.append(bt)
            own.append(b * t - bt)
            ns.append(n)
            mems.append(self.memory(s.chip, s.tp, s.recompute, sdp, s.layers, n, k == 0, k == p - 1, share=share,
                                    one_matrix=lone))
            caps.append(self._chip[s.chip].usable_bytes)
        if tie := self.tie_update(stages, dp, p * kind(schedule).chunks(params or {})):
            for k in {0, p - 1}:
                us[k] += tie
        # a boundary of inner_dp replicas spreads over inner_dp x tp NICs (as plan_sim.stage_times prices it)
        es = [
            self.boundary(a.chip, a.tp * a.inner_dp, c.chip, c.tp * c.inner_dp, dp) for a, c in zip(stages, stages[1:])
        ]
        gaps = self.drain_gaps([(s.chip, s.tp) for s in stages], dp, schedule)
        lats = [self.latency(a.chip, c.chip) for a, c in zip(stages, stages[1:])]
        sk = kind(schedule)
        v = sk.chunks(params or {})
        wrap = None
        if v > 1:  # interleaved: a micro-batch crosses each boundary v times, the last stage -> first v - 1 times
            back, front = stages[-1], stages[0]
            wrap = (v, self.boundary(back.chip, back.tp * back.inner_dp, front.chip, front.tp * front.inner_dp, dp),
                    self.latency(back.chip, front.chip))
        link_own = [b * v * e - 2 * e for e in es] + ([b * (v - 1) * wrap[1] - 2 * wrap[1]] if wrap else [])
        # latency is pipelined: it only adds to fill and drain
        fill = sum(beta) + 2 * v * (sum(es) + sum(lats)) + (2 * (v - 1) * (wrap[1] + wrap[2]) if wrap else 0.0)
        upd_term = max(u - d for u, d in zip(us, gaps))
        span = sk.round_trip_span
        spans = [span(k, p, b, params or {}) for k in range(p)] if span is not None else ns
        ks = max(range(p), key=lambda k: own[k])
        top, where = own[ks], f"stage {ks}"
        if round_trips and sk.alternates and wrap is None:
            # the stages' own timelines and the round trips, warm-up and drain as they run, replace the
            # steady-state term, which charges a stage's whole b c_k next to a whole fill
            held = [sk.held_weight_passes(k, p, b, params or {}) if sk.held_weight_passes else b for k in range(p)]
            ws = [c - x for c, x in zip(cs, beta)]  # deferred weight passes (0 where none are)
            top = -math.inf
            for bound, at in (stage_bound(fs, bs, ws, es, lats, spans, b, held),
                              round_trip_bound(fs, bs, ws, es, lats, spans, b, held)):
                if bound - fill > top:
                    top, where = bound - fill, at
        if link_own and max(link_own) > top:
            j = max(range(len(link_own)), key=lambda j: link_own[j])
            top, where = link_own[j], f"link {j}->{(j + 1) % p}"
        if round_trips and not (sk.alternates or sk.whole_passes):
            # no closed form covers the schedule's round trips (interleaved: its virtual stages wrap around):
            # the longest chains of its actions as the simulator runs them, each link's queue in turn
            run = virtual_stages(stages, v)
            times, links = self.stage_times(run, dp, v)
            lat_v = [self.latency(a.chip, c.chip) for a, c in zip(run, run[1:])]
            t, where = chain_bound(times, links, b, schedule, lat_v, params)
            return Estimate(iteration_time_s=t, stage_time_s=cs, stage_update_s=us, stage_memory_bytes=mems,
                            stage_capacity_bytes=caps, in_flight=ns, boundary_s=es, bottleneck=where,
                            fill_drain_s=fill, feasible=all(m <= c for m, c in zip(mems, caps)),
                            details={"update_term_s": upd_term, "drain_gap_s": gaps})
        if round_trips:
            pt, pt_where = self.pass_term(fs, bs, es, lats, b, spans)
            if pt > top + fill:
                top, where = pt - fill, pt_where
        if round_trips and sk.whole_passes:
            # the whole passes' flow shops give each stage's last backward exactly (identical jobs): each
            # update follows its own stage's end, which under GPipe can come long before stage 0's
            last = self.pass_last_backward(fs, bs, es, lats, b, spans)
            last[0] = max(last[0], top + fill)
            upd_term = max(t + u for t, u in zip(last, us)) - top - fill
        if round_trips and sk.alternates and wrap is None:
            # each stage's update follows its own last backward (and, under ZB-H1, its held-back weight
            # passes), not stage 0's end less one layer's backward and hop per stage (drain_gaps), which
            # charged a large update in full where its stage ends long before stage 0
            last = last_backward_ends(fs, bs, ws, es, lats, spans, b, held,
                                      self.pass_last_backward(fs, bs, es, lats, b, spans, ws, held))
            last[0] = max(last[0], top + fill)
            upd_term = max(t + min(h + 1, b) * w + u for t, h, w, u in zip(last, held, ws, us)) - top - fill
        return Estimate(iteration_time_s=top + fill + upd_term, stage_time_s=cs, stage_update_s=us,
                        stage_memory_bytes=mems, stage_capacity_bytes=caps, in_flight=ns, boundary_s=es,
                        bottleneck=where, fill_drain_s=fill, feasible=all(m <= c for m, c in zip(mems, caps)),
                        details={"update_term_s": upd_term, "drain_gap_s": gaps})


def layers_within(terms: tuple[float, float, float], n: int) -> int:
    """Most layers a stage holds with n micro-batches in flight, from CostModel.room_terms (0 when not even
    one fits): h2's bounds ask for a thousand in-flight counts of a few dozen stage kinds."""
    room, static, act = terms
    per = static + n * act
    return max(0, int(room // per)) if room >= per else 0


def micro_batches(train: TrainSpec, dp: int) -> int:
    total = train.micro_batches_total
    if total % dp:
        raise InfeasibleError(f"global batch of {train.global_batch} sequences ({total} micro-batches of "
                              f"{train.micro_batch_size}) is not divisible by dp={dp}")
    return total // dp
