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
from ..schedules import Action
from .config import DEFAULT_RECV_WINDOW
from .p2p import P2P, Pending
from .reshard import Boundary
from .topology import Groups, rank_of


class StageExecutor:
    def __init__(self, model: StageModel, plan: Plan, groups: Groups, p2p: P2P, act_shape: tuple[int, ...],
                 recv_window: int = DEFAULT_RECV_WINDOW) -> None:
        if recv_window < 0:
            raise ValueError(f"recv_window must be >= 0 (receives posted ahead), got {recv_window}")
        self.model, self.plan, self.g, self.p2p = model, plan, groups, p2p
        self.recv_window = recv_window
        self.k, self.d, self.t = groups.coord.stage, groups.coord.replica, groups.coord.tp_rank
        self.n = len(plan.stages)
        self.shape = torch.Size(act_shape)
        self.numel = self.shape.numel()
        tps = [s.tp for s in plan.stages]
        self.fwd_in = Boundary(tps[self.k - 1], tps[self.k]) if self.k > 0 else None
        self.fwd_out = Boundary(tps[self.k], tps[self.k + 1]) if self.k < self.n - 1 else None
        self.bwd_in = Boundary(tps[self.k + 1], tps[self.k]) if self.k < self.n - 1 else None
        self.bwd_out = Boundary(tps[self.k], tps[self.k - 1]) if self.k > 0 else None

    # -- communication -------------------------------------------------------------------------------
    def _post(self, a: Action) -> Pending:
        fwd = a.op == "RECV_F"
        b = self.fwd_in if fwd else self.bwd_in
        peer_stage = self.k - 1 if fwd else self.k + 1
        sources = [(rank_of(self.plan, peer_stage, self.d, i), piece) for i, piece in b.incoming(self.t)]
        return self.p2p.post_recv(f"{'activation' if fwd else 'gradient'} of micro-batch {a.mb}", sources,
                                  b.piece_numel(self.numel), torch.float32, a.mb, backward=not fwd)

    def _receive(self, pend: Pending, b: Boundary) -> torch.Tensor:
        mine = self.p2p.wait_recv(pend, self.g.device)
        return b.assemble(mine, self.t, self.g.tp, self.shape)

    def _send(self, t: torch.Tensor, a: Action) -> None:
        fwd = a.op == "SEND_F"
        b = self.fwd_out if fwd else self.bwd_out
        peer_stage = self.k + 1 if fwd else self.k - 1
        pieces = b.split(t)
        dests = [(rank_of(self.plan, peer_stage, self.d, j), pieces[piece]) for j, piece in b.outgoing(self.t)]
        key = f"{'F' if fwd else 'B'}{min(self.k, peer_stage)}"  # boundary index, direction
        self.p2p.send(f"{'activation' if fwd else 'gradient'} of micro-batch {a.mb}", dests, a.mb, not fwd, key)

    # -- one step -----------------------------------------------------------------------------------
    def run(self, actions: list[Action], inputs: list[torch.Tensor], targets: list[torch.Tensor],
            loss_scale: float) -> float:
        recvs = [a for a in actions if a.op in ("RECV_F", "RECV_B")]
        posted: dict[tuple[str, int], Pending] = {}
        ahead = 0  # recvs[:ahead] have been posted

        def post_until(n: int) -> None:
            nonlocal ahead
            while ahead < min(n, len(recvs)):
                r = recvs[ahead]
                posted[(r.op, r.mb)] = self._post(r)
                ahead += 1

        post_until(self.recv_window)
        consumed = 0
        x_in: dict[int, torch.Tensor] = {}
        out: dict[int, torch.Tensor] = {}
        grad_out: dict[int, torch.Tensor] = {}
        stores: dict[int, WeightGradStore] = {}
        loss_sum = 0.0
        spans: list[tuple[str, int, float, float]] | None = [] if _TIMING_DIR else None
        for a in actions:
            m = a.mb
            t0 = time.perf_counter() if spans is not None else 0.0
            if a.op in ("RECV_F", "RECV_B"):
                consumed += 1
                post_until(consumed + self.recv_window)  # this one, and the window beyond it
                pend = posted.pop((a.op, m))
                if a.op == "RECV_F":
                    x_in[m] = self._receive(pend, self.fwd_in).requires_grad_()
                else:
                    grad_out[m] = self._receive(pend, self.bwd_in)
            elif a.op == "F":
                x = inputs[m].to(self.g.device) if self.k == 0 else x_in[m]
                y = self.model(x)
                if self.model.last:
                    y = self.model.loss(y, targets[m].to(self.g.device)) * loss_scale
                    loss_sum += y.item()
                out[m] = y
            elif a.op == "SEND_F":
                self._send(out[m], a)
            elif a.op in ("B", "I"):
                store = stores.setdefault(m, WeightGradStore())
                y = out.pop(m)
                grad = None if self.model.last else grad_out.pop(m)
                if a.op == "I":
                    with store:
                        torch.autograd.backward(y, grad)
                else:
                    torch.autograd.backward(y, grad)
            elif a.op == "W":
                stores.pop(m).flush()
            elif a.op == "SEND_B":
                self._send(x_in.pop(m).grad, a)
            if spans is not None:
                spans.append((a.op, m, t0, time.perf_counter()))
        if stores and any(s.queue for s in stores.values()):
            raise RuntimeError(f"stage {self.k}: weight gradients of micro-batches "
                               f"{sorted(m for m, s in stores.items() if s.queue)} were never computed (missing W)")
        self.p2p.drain()
        sync_replicated_grads(list(self.model.parameters()), self.model.tp)
        if spans is not None:
            _write_spans(self.p2p.rank, self.k, spans)
        return loss_sum


_TIMING_DIR = os.environ.get("HETEROPP_TIMING")


def _write_spans(rank: int, stage: int, spans: list[tuple[str, int, float, float]]) -> None:
    with open(os.path.join(_TIMING_DIR, f"rank{rank}.jsonl"), "a") as f:
        f.write(json.dumps({"stage": stage, "spans": spans}) + "\n")
