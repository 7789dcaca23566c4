"""Asynchronous point-to-point between stages: receives are posted early and waited for late; every wait
has a deadline and a failure names the stage, peer rank and micro-batch."""
from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist


class PipelineCommError(RuntimeError):
    pass


def tag(mb: int, backward: bool) -> int:
    return 2 * mb + int(backward)


@dataclass
class Pending:
    """Posted messages of one RECV action: (peer rank, piece index, buffer, work)."""
    what: str
    parts: list[tuple[int, int, torch.Tensor, Any]] = field(default_factory=list)


class P2P:
    def __init__(self, rank: int, stage: int, timeout_s: float, stage_through_cpu: bool) -> None:
        self.rank, self.stage = rank, stage
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.via_cpu = stage_through_cpu
        self.sends: list[tuple[str, Any]] = []
        self.bytes_sent: dict[str, int] = {}

    def post_recv(self, what: str, sources: list[tuple[int, int]], numel: int, dtype: torch.dtype, mb: int,
                  backward: bool) -> Pending:
        pend = Pending(what)
        for src, piece in sources:
            buf = torch.empty(numel, dtype=dtype)
            pend.parts.append((src, piece, buf, dist.irecv(buf, src, tag=tag(mb, backward))))
        return pend

    def wait_recv(self, pend: Pending, device: torch.device) -> list[torch.Tensor]:
        for src, _, _, work in pend.parts:
            self._wait(work, f"receiving {pend.what} from rank {src}")
        return [buf.to(device) for _, _, buf, _ in sorted(pend.parts, key=lambda p: p[1])]

    def send(self, what: str, dests: list[tuple[int, torch.Tensor]], mb: int, backward: bool, key: str) -> None:
        for dst, piece in dests:
            buf = piece.detach().to("cpu" if self.via_cpu else piece.device).contiguous().clone()
            self.sends.append((f"sending {what} to rank {dst}", dist.isend(buf, dst, tag=tag(mb, backward))))
            self.bytes_sent[key] = self.bytes_sent.get(key, 0) + buf.numel() * buf.element_size()

    def drain(self) -> None:
        for what, work in self.sends:
            self._wait(work, what)
        self.sends.clear()

    def _wait(self, work: Any, what: str) -> None:
        try:
            ok = work.wait(self.timeout)
        except Exception as e:
            raise PipelineCommError(f"rank {self.rank} (stage {self.stage}): {what} failed: {e}") from e
        if ok is False:
            raise PipelineCommError(f"rank {self.rank} (stage {self.stage}): {what} timed out after "
                                    f"{self.timeout.total_seconds():.0f} s (is the peer stage alive?)")
