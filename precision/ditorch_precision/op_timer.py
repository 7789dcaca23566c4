"""op_timer: wall time of each op, synchronised with the device before and after it."""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

import torch
from torch.utils._pytree import tree_leaves

from .records import OpRecord
from .selection import Selector
from .tool import Tool


@dataclass
class OpTime:
    op: str
    count: int = 0
    total_s: float = 0.0
    max_s: float = 0.0

    def to_dict(self) -> dict:
        mean = self.total_s / self.count if self.count else 0.0
        return {"op": self.op, "count": self.count, "total_ms": self.total_s * 1e3, "mean_us": mean * 1e6,
                "max_us": self.max_s * 1e6}


def _sync_for(args) -> None:
    # CPU ops finish before returning; device ops need the device drained to be timed.
    devices = {t.device.type for t in tree_leaves(args) if isinstance(t, torch.Tensor)}
    if devices - {"cpu", "meta"}:
        torch.accelerator.synchronize()


class OpTimer(Tool):
    """``with OpTimer() as t: train()`` then ``print(t.table(20))``. ``by_module`` keys by op and module."""

    name = "op_timer"

    def __init__(self, selector: Selector | None = None, *, by_module: bool = False, out: str | None = None,
                 top: int = 20, **kwargs) -> None:
        super().__init__(selector, **kwargs)
        self.by_module = by_module
        self.out, self.top_n = out, top
        self.times: dict[str, OpTime] = {}

    def handle(self, rec: OpRecord, func, args, kwargs):
        _sync_for((args, kwargs))
        t0 = time.perf_counter()
        out = func(*args, **kwargs)
        _sync_for(out)
        dt = time.perf_counter() - t0
        key = f"{rec.op} @ {rec.module}" if self.by_module else rec.op
        entry = self.times.get(key) or self.times.setdefault(key, OpTime(key))
        entry.count += 1
        entry.total_s += dt
        entry.max_s = max(entry.max_s, dt)
        return out

    def top(self, n: int | None = None) -> list[OpTime]:
        return sorted(self.times.values(), key=lambda e: -e.total_s)[: n or self.top_n]

    def table(self, n: int | None = None) -> str:
        total = sum(e.total_s for e in self.times.values()) or 1.0
        lines = [f"{'op':<48} {'calls':>7} {'total ms':>10} {'share':>6} {'mean us':>9} {'max us':>9}"]
        for e in self.top(n):
            d = e.to_dict()
            lines.append(f"{e.op[:48]:<48} {e.count:>7} {d['total_ms']:>10.3f} {e.total_s / total:>6.1%} "
                         f"{d['mean_us']:>9.1f} {d['max_us']:>9.1f}")
        return "\n".join(lines)

    def finish(self) -> None:
        if self.out:
            path = self.out.format(rank=self.rank.get())
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            with open(path, "w") as f:
                json.dump({"ops": [e.to_dict() for e in self.top(len(self.times))]}, f, indent=1)
