"""Runs one stage's action list (F, B, I, W, SEND_*/RECV_*) for one optimizer step.

Receives are posted ahead, in action order, and waited for only when their action comes up, so
transfers overlap with compute; at most `recv_window` receives are posted beyond the one being waited
for, which bounds the receive buffers a stage holds (one activation or gradient each) however many
micro-batches a step has. Sends complete in the background and are drained at the end of the step;
being non-blocking, they never wait on a receive that is posted later. I runs the backward with weight
gradients of the linear layers deferred into a per-micro-batch WeightGradStore, which the matching W
action flushes.

Diagnostics: with HETEROPP_TIMING=DIR set, every rank appends the start and end of each of its actions
(seconds on its own clock) as one JSON line per step to DIR/rank<R>.jsonl; unset, nothing is timed.
"""
from __future__ import annotations

import json
import os
import time

import torch

from ..model import StageModel, WeightGradStore
from ..model.parallel import sync_replicated_grads
from ..plan import Plan
from ..schedules import Action, Op
from ..schedules.actions import COMPUTE
from .config import DEFAULT_RECV_WINDOW
from .p2p import P2P, Pending
from .reshard import BatchSplit, Boundary
from .topology import Groups, rank_of

_RECV = (Op.RECV_F, Op.RECV_B)


class StageExecutor:
    def __init__(self, model: StageModel | list[StageModel], plan: Plan, groups: Groups, p2p: P2P,
                 act_shape: tuple[int, ...], recv_window: int = DEFAULT_RECV_WINDOW,
                 act_dtype: torch.dtype = torch.float32) -> None:
        """model: this stage's model, or its chunks in order (interleaved plans: chunk c is virtual stage
        c * p + k); act_shape: one micro-batch's activation as this stage's inner replica holds it (its slice
        of the micro-batch's sequences)."""
        if recv_window < 0:
            raise ValueError(f"recv_window must be >= 0 (receives posted ahead), got {recv_window}")
        self.models = model if isinstance(model, list) else [model]
        self.model, self.plan, self.g, self.p2p = self.models[0], plan, groups, p2p
        self.recv_window, self.act_dtype = recv_window, act_dtype
        self.compute_s = 0.0
        self.delay_s = 0.0  # tests: a slowed chip (added to each compute action)
        c = groups.coord
        self.k, self.d, self.t, self.outer, self.inner = c.stage, c.replica, c.tp_rank, c.outer, c.inner
        self.p, self.n = plan.devices, len(plan.stages)  # groups of chips, virtual stages
        self.shape = torch.Size(act_shape)
        # the stage a forward / backward receive comes from, and a send goes to (chunks wrap around)
        self.peer = {"F": (self.k - 1) % self.p, "B": (self.k + 1) % self.p}
        self.to = {"F": (self.k + 1) % self.p, "B": (self.k - 1) % self.p}

    def _virtual(self, a: Action) -> int:
        return a.chunk * self.p + self.k

    def _tag(self, a: Action) -> int:
        """Message id of the transfer an action sends or receives: micro-batch and receiving virtual stage
        (several chunks' transfers share a pair of ranks)."""
        vs = self._virtual(a)
        to = vs if a.op in _RECV else vs + 1 if a.op is Op.SEND_F else vs - 1
        return a.mb * self.n + to

    def _split(self, peer_stage: int) -> BatchSplit:
        inner = [s.inner_dp for s in self.plan.stages]
        return BatchSplit(self.plan.micro_batch_size, inner[self.k], inner[peer_stage])

    def _peer_rank(self, stage: int, inner: int, tp_rank: int) -> int:
        return rank_of(self.plan, stage, self.outer * self.plan.stages[stage].inner_dp + inner, tp_rank)

    def _segment_shape(self, lo: int, hi: int) -> torch.Size:
        return torch.Size((hi - lo, *self.shape[1:]))

    # -- communication -------------------------------------------------------------------------------
    def _post(self, a: Action) -> list[tuple[Pending, torch.Size]]:
        """Receives for every segment of rows this rank shares with a peer slice (one segment unless the
        two stages split micro-batches differently)."""
        fwd = a.op is Op.RECV_F
        peer = self.peer["F" if fwd else "B"]
        b = Boundary(self.plan.stages[peer].tp, self.plan.stages[self.k].tp)
        out = []
        for j, lo, hi in self._split(peer).segments(self.inner):
            shape = self._segment_shape(lo, hi)
            sources = [(self._peer_rank(peer, j, i), piece) for i, piece in b.incoming(self.t)]
            out.append((self.p2p.post_recv(f"{'activation' if fwd else 'gradient'} of micro-batch {a.mb}", sources,
                                           b.piece_numel(shape.numel()), self.act_dtype, self._tag(a),
                                           backward=not fwd), shape))
        return out

    def _receive(self, posted: list[tuple[Pending, torch.Size]], peer: int) -> torch.Tensor:
        b = Boundary(self.plan.stages[peer].tp, self.plan.stages[self.k].tp)
        segs = [b.assemble(self.p2p.wait_recv(pend, self.g.device), self.t, self.g.tp, shape) for pend, shape in posted]
        return segs[0] if len(segs) == 1 else torch.cat(segs)

    def _send(self, t: torch.Tensor, a: Action) -> None:
        fwd = a.op is Op.SEND_F
        peer = self.to["F" if fwd else "B"]
        b = Boundary(self.plan.stages[self.k].tp, self.plan.stages[peer].tp)
        split = self._split(peer)
        first = split.span(self.inner, split.mine)[0]
        vs = self._virtual(a)
        key = f"{'F' if fwd else 'B'}{vs if fwd else vs - 1}"  # virtual boundary index, direction
        for j, lo, hi in split.segments(self.inner):
            pieces = b.split(t[lo - first:hi - first])
            dests = [(self._peer_rank(peer, j, r), pieces[piece]) for r, piece in b.outgoing(self.t)]
            self.p2p.send(f"{'activation' if fwd else 'gradient'} of micro-batch {a.mb}", dests, self._tag(a), not fwd,
                          key)

    # -- one step -----------------------------------------------------------------------------------
    def run(self, actions: list[Action], inputs: list[torch.Tensor], targets: list[torch.Tensor],
            loss_scale: float) -> float:
        recvs = [a for a in actions if a.op in _RECV]
        posted: dict[tuple[str, int, int], list[tuple[Pending, torch.Size]]] = {}
        ahead = 0  # recvs[:ahead] have been posted

        def post_until(n: int) -> None:
            nonlocal ahead
            while ahead < min(n, len(recvs)):
                r = recvs[ahead]
                posted[(r.op, r.mb, r.chunk)] = self._post(r)
                ahead += 1

        post_until(self.recv_window)
        consumed = 0
        # keyed by (chunk, micro-batch)
        x_in: dict[tuple[int, int], torch.Tensor] = {}
        out: dict[tuple[int, int], torch.Tensor] = {}
        grad_out: dict[tuple[int, int], torch.Tensor] = {}
        stores: dict[tuple[int, int], WeightGradStore] = {}
        loss_sum = 0.0
        spans: list[tuple[str, int, float, float]] | None = [] if _TIMING_DIR else None
        self.compute_s = 0.0  # this step's time in F, B, I and W actions (straggler detection)
        for a in actions:
            m, key = a.mb, (a.chunk, a.mb)
            model = self.models[a.chunk]
            t0 = time.perf_counter()
            if a.op in _RECV:
                consumed += 1
                post_until(consumed + self.recv_window)  # this one, and the window beyond it
                pend = posted.pop((a.op, m, a.chunk))
                if a.op is Op.RECV_F:
                    x_in[key] = self._receive(pend, self.peer["F"]).requires_grad_()
                else:
                    grad_out[key] = self._receive(pend, self.peer["B"])
            elif a.op is Op.F:
                x = inputs[m].to(self.g.device) if model.first else x_in[key]
                y = model(x)
                if model.last:
                    y = model.loss(y, targets[m].to(self.g.device)) * loss_scale
                    loss_sum += y.item()
                out[key] = y
            elif a.op is Op.SEND_F:
                self._send(out[key], a)
            elif a.op in (Op.B, Op.I):
                store = stores.setdefault(key, WeightGradStore())
                y = out.pop(key)
                grad = None if model.last else grad_out.pop(key)
                if a.op is Op.I:
                    with store:
                        torch.autograd.backward(y, grad)
                else:
                    torch.autograd.backward(y, grad)
            elif a.op is Op.W:
                stores.pop(key).flush()
            elif a.op is Op.SEND_B:
                self._send(x_in.pop(key).grad, a)
            if a.op in COMPUTE:
                if self.delay_s:
                    time.sleep(self.delay_s)
                self.compute_s += time.perf_counter() - t0
            if spans is not None:
                spans.append((a.op, m, t0, time.perf_counter()))
        if stores and any(s.queue for s in stores.values()):
            raise RuntimeError(
                f"stage {self.k}: weight gradients of micro-batches "
                f"{sorted(m for (_, m), s in stores.items() if s.queue)} were never computed (missing W)"
            )
        self.p2p.drain()
        sync_replicated_grads([q for mdl in self.models for q in mdl.parameters()], self.model.tp)
        if spans is not None:
            _write_spans(self.p2p.rank, self.k, spans)
        return loss_sum


_TIMING_DIR = os.environ.get("HETEROPP_TIMING")


def _write_spans(rank: int, stage: int, spans: list[tuple[str, int, float, float]]) -> None:
    with open(os.path.join(_TIMING_DIR, f"rank{rank}.jsonl"), "a") as f:
        f.write(json.dumps({"stage": stage, "spans": spans}) + "\n")
