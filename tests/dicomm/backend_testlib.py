"""Helpers shared by the dicomm backend tests: deterministic inputs and result comparison.

Inputs are a pure function of (key, rank, shape, dtype), so any rank (or the test process) can
recompute what every other rank contributed and build an independent reference.
"""
from __future__ import annotations

import zlib
from typing import Any

import torch

ALL_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8,
              torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool]


def make_input(key: str, rank: int, shape: tuple[int, ...] = (7,),
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Small integers (exact in every dtype, so sums and products are order-independent)."""
    g = torch.Generator().manual_seed(zlib.crc32(f"{key}/{rank}".encode()))
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    lo = 0 if dtype == torch.uint8 else -3
    return torch.randint(lo, 4, shape, generator=g).to(dtype)


def make_floats(key: str, rank: int, n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(zlib.crc32(f"{key}/{rank}".encode()))
    return torch.randn(n, generator=g)


def assert_same_results(got: dict[str, Any], want: dict[str, Any], who: str) -> None:
    """Exact equality, except keys starting with '~' (float results whose summation order may
    differ between backends), which are compared with torch's default tolerances."""
    assert sorted(got) == sorted(want), f"{who}: different result keys"
    for key in want:
        a, b = got[key], want[key]
        if isinstance(b, torch.Tensor):
            if key.startswith("~"):
                torch.testing.assert_close(a, b, msg=lambda m, key=key: f"{who} {key}: {m}")
            else:
                assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), \
                    f"{who} {key}: got {a}, expected {b}"
        elif isinstance(b, (list, tuple)) and b and isinstance(b[0], torch.Tensor):
            assert len(a) == len(b), f"{who} {key}: {len(a)} tensors, expected {len(b)}"
            for i, (x, y) in enumerate(zip(a, b)):
                assert torch.equal(x, y), f"{who} {key}[{i}]: got {x}, expected {y}"
        else:
            assert a == b, f"{who} {key}: got {a!r}, expected {b!r}"


class _Packed:
    """A tensor as plain bytes: the harness queue would otherwise share tensor storage by file
    descriptor, which dies with the rank process."""

    def __init__(self, t: torch.Tensor) -> None:
        t = t.detach().cpu().contiguous()
        self.dtype, self.shape = t.dtype, tuple(t.shape)
        self.data = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""

    def unpack(self) -> torch.Tensor:
        if not self.data:
            return torch.empty(self.shape, dtype=self.dtype)
        raw = torch.frombuffer(bytearray(self.data), dtype=torch.uint8)
        return raw.view(self.dtype).reshape(self.shape)


def pack(value: Any) -> Any:
    """Makes a result safe to return from a rank (tensors inside dicts, lists, tuples)."""
    if isinstance(value, torch.Tensor):
        return _Packed(value)
    if isinstance(value, dict):
        return {k: pack(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(pack(v) for v in value)
    return value


def unpack(value: Any) -> Any:
    if isinstance(value, _Packed):
        return value.unpack()
    if isinstance(value, dict):
        return {k: unpack(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(unpack(v) for v in value)
    return value


def run_unpacked(fn: Any, world_size: int, *args: Any, **kwargs: Any) -> list[Any]:
    """run_ranks for rank functions that return pack()ed results."""
    from tests.dicomm.multiproc import run_ranks
    return [unpack(r) for r in run_ranks(fn, world_size, *args, **kwargs)]
