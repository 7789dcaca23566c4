"""Activation resharding between consecutive stages with different TP sizes (the H2 paper's Figure 10)
and different inner data parallelism (split along the batch dimension).

Batch: a stage with inner_dp = a splits every micro-batch's rows into a equal slices, one per inner replica.
Between stages with a and b slices, the rows a sender and a receiver share form one contiguous segment
(`BatchSplit.segments`); each segment crosses once, resharded over the two TP groups as below, and a
receiver concatenates its segments. Every byte of an activation or gradient is sent once.

Every rank of a TP group holds the whole (replicated) activation. The activation is cut into
L = lcm(t_send, t_recv) equal pieces; piece k goes from sender k % t_send to receiver k % t_recv, so every
byte crosses the boundary exactly once, and each receiver then all-gathers the pieces inside its own TP
group. By the Chinese remainder theorem each sender/receiver pair exchanges at most one piece. Gradients
go back the same way with the roles swapped.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..model.parallel import TPGroup


@dataclass(frozen=True)
class Boundary:
    send_tp: int
    recv_tp: int

    @property
    def pieces(self) -> int:
        return math.lcm(self.send_tp, self.recv_tp)

    def outgoing(self, i: int) -> list[tuple[int, int]]:
        """(receiver, piece) pairs that sender i sends."""
        return [(k % self.recv_tp, k) for k in range(i, self.pieces, self.send_tp)]

    def incoming(self, j: int) -> list[tuple[int, int]]:
        """(sender, piece) pairs that receiver j gets."""
        return [(k % self.send_tp, k) for k in range(j, self.pieces, self.recv_tp)]

    def piece_numel(self, numel: int) -> int:
        return -(-numel // self.pieces)

    def split(self, t: torch.Tensor) -> list[torch.Tensor]:
        """The L pieces of a tensor (zero-padded at the end to a multiple of L)."""
        flat = t.detach().reshape(-1)
        size = self.piece_numel(flat.numel())
        pad = size * self.pieces - flat.numel()
        if pad:
            flat = torch.cat([flat, flat.new_zeros(pad)])
        return list(flat.split(size))

    def assemble(self, mine: list[torch.Tensor], j: int, tp: TPGroup, shape: torch.Size) -> torch.Tensor:
        """Receiver j holds pieces j, j+t_recv, ...; all-gather them in its TP group and rebuild the tensor."""
        local = torch.cat(mine)
        if tp.size == 1:
            parts = [local]
        else:
            parts = [torch.empty_like(local) for _ in range(tp.size)]
            dist.all_gather(parts, local, group=tp.group)
        per = len(mine)
        ordered: list[torch.Tensor] = [torch.empty(0)] * self.pieces
        for r, part in enumerate(parts):
            for n, piece in enumerate(part.split(local.numel() // per)):
                ordered[r + n * self.recv_tp] = piece
        numel = math.prod(shape)
        return torch.cat(ordered)[:numel].view(shape)


@dataclass(frozen=True)
class BatchSplit:
    """Rows of a micro-batch of `rows` sequences split into `mine` slices on this side and `peer` slices on the
    other side of a boundary."""
    rows: int
    mine: int
    peer: int

    def span(self, i: int, parts: int) -> tuple[int, int]:
        size = self.rows // parts
        return i * size, (i + 1) * size

    def segments(self, me: int) -> list[tuple[int, int, int]]:
        """(peer slice, first row, end row) of every peer slice that shares rows with my slice `me`, in row
        order; rows are global within the micro-batch."""
        lo, hi = self.span(me, self.mine)
        out = []
        for j in range(self.peer):
            plo, phi = self.span(j, self.peer)
            if max(lo, plo) < min(hi, phi):
                out.append((j, max(lo, plo), min(hi, phi)))
        return out
