"""Shared pieces of the collectives tests: a communicator on the harness store, deterministic
per-rank inputs, and reference results computed independently of dicomm (numpy / exact integer
arithmetic, never dicomm's own kernels).

Processes on one host stand in for nodes; the shared-memory transport stands in for the network.
"""
from __future__ import annotations

import time

import numpy as np
import torch

FLOAT_DTYPES = ["float32", "float64", "float16", "bfloat16"]
INT_DTYPES = ["int8", "int16", "int32", "int64", "uint8"]
DTYPES = FLOAT_DTYPES + INT_DTYPES + ["bool"]
OPS = ["sum", "avg", "product", "min", "max", "band", "bor", "bxor"]
TORCH_DTYPES = {name: getattr(torch, name) for name in DTYPES}

# Thresholds shrunk so small buffers take the large-message algorithms with many chunks.
TINY_THRESHOLDS = {"DICOMM_COLL_SMALL_BYTES": "256", "DICOMM_COLL_CHUNK_BYTES": "96"}


def valid(dtype: str, op: str) -> bool:
    if op in ("band", "bor", "bxor") and dtype in FLOAT_DTYPES:
        return False
    return not (op == "avg" and dtype == "bool")


def open_comm(rank: int, world: int, store, timeout_s: float = 20.0, name: str = "coll"):
    import torch.distributed as dist
    from dicomm import _C

    # Several ranks share two cores: torch's own worker threads would only fight over them.
    torch.set_num_threads(1)
    return _C.Communicator(dist.PrefixStore(name, store), rank, world, timeout_s=timeout_s)


def close_comm(comm) -> None:
    """Ends a test's communicator once every rank is done with it."""
    comm.barrier().wait()
    # The engine may report a peer that closes right after its last send as lost before that
    # send is drained; a short grace period keeps teardown from failing the last barrier.
    time.sleep(0.2)
    comm.close()


def inputs(seed: int, rank: int, numel: int, dtype: str, op: str) -> torch.Tensor:
    """Rank `rank`'s input. Float values keep every result exactly representable: sums of
    integers in [-16, 16], products of +-{1/2, 1, 2}. Integers span the dtype to exercise wrap."""
    g = torch.Generator().manual_seed(seed * 1009 + rank)
    if dtype == "bool":
        return torch.randint(0, 2, (numel,), generator=g).bool()
    if dtype in FLOAT_DTYPES:
        if op == "product":
            choices = torch.tensor([-2.0, -1.0, -0.5, 0.5, 1.0, 2.0], dtype=torch.float64)
            values = choices[torch.randint(0, 6, (numel,), generator=g)]
        else:
            values = torch.randint(-16, 17, (numel,), generator=g).double()
        return values.to(TORCH_DTYPES[dtype])
    info = torch.iinfo(TORCH_DTYPES[dtype])
    lo, hi = max(info.min, -(2**62)), min(info.max, 2**62)
    values = torch.randint(lo, hi + 1, (numel,), generator=g, dtype=torch.int64)
    return values.to(TORCH_DTYPES[dtype])


def _wrap(values: np.ndarray, dtype: str) -> np.ndarray:
    """Two's-complement wrap of uint64 values to `dtype`."""
    bits = torch.iinfo(TORCH_DTYPES[dtype]).bits
    unsigned = values.astype(getattr(np, f"uint{bits}"))
    return unsigned.view(np.dtype(dtype))


def reference(per_rank: list[torch.Tensor], dtype: str, op: str) -> torch.Tensor:
    """op over the ranks' tensors, computed in float64 (floats) or modulo 2**64 (integers)."""
    world = len(per_rank)
    if dtype == "bool":
        a = np.stack([t.numpy() for t in per_rank])
        fold = {"sum": np.any, "max": np.any, "bor": np.any, "product": np.all, "min": np.all,
                "band": np.all}
        out = (np.sum(a, axis=0) % 2 == 1) if op == "bxor" else fold[op](a, axis=0)
        return torch.from_numpy(np.ascontiguousarray(out))
    if dtype in FLOAT_DTYPES:
        a = torch.stack([t.double() for t in per_rank])
        if op in ("sum", "avg"):
            out = a.sum(0) / (world if op == "avg" else 1)
        elif op == "product":
            out = a.prod(0)
        else:  # NaN propagates, as in torch.minimum / maximum
            out = a.amin(0) if op == "min" else a.amax(0)
            out[torch.isnan(a).any(0)] = float("nan")
        # Sums and products of the inputs are exact; AVG's one division is rounded once to
        # float32/float64 and once more to 16 bits, which for these widths equals rounding once
        # (p' >= 2p + 2), so the comparison can be exact.
        return out.to(TORCH_DTYPES[dtype])
    signed = np.stack([t.to(torch.int64).numpy() for t in per_rank])
    unsigned = signed.astype(np.uint64)
    if op in ("sum", "avg"):
        out = _wrap(unsigned.sum(0, dtype=np.uint64), dtype)
        if op == "avg":  # documented: truncation toward zero of the wrapped sum
            wide = out.astype(np.int64)
            if dtype == "int64":  # beyond float64's exact range: Python integers
                quotient = [abs(v) // world * (1 if v >= 0 else -1) for v in wide.tolist()]
                out = np.array(quotient, dtype=np.int64)
            else:  # |sum| < 2**32: float64 division then truncation is exact
                out = np.trunc(wide / world).astype(np.int64).astype(np.dtype(dtype))
    elif op == "product":
        out = _wrap(np.prod(unsigned, axis=0, dtype=np.uint64), dtype)
    elif op == "min":
        out = signed.min(0).astype(np.dtype(dtype))
    elif op == "max":
        out = signed.max(0).astype(np.dtype(dtype))
    else:
        fn = {"band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}[op]
        out = _wrap(fn.reduce(unsigned, axis=0), dtype)
    return torch.from_numpy(np.ascontiguousarray(out))


def rank_order_inputs(seed: int, rank: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """Random floats whose magnitudes differ by rank, so that the order of a sum shows in its rounding."""
    g = torch.Generator().manual_seed(seed * 1009 + rank)
    return (torch.randn(numel, generator=g) * 10 ** (rank % 3)).to(dtype)


def rank_order_sum(per_rank: list[torch.Tensor], op: str) -> torch.Tensor:
    """torch's sequential sum x0 + x1 + ... in rank order, in the inputs' dtype (avg: divided by the count)."""
    out = per_rank[0]
    for x in per_rank[1:]:
        out = out + x
    return out / len(per_rank) if op == "avg" else out


def same(got: torch.Tensor, expected: torch.Tensor) -> bool:
    """Bit-for-bit equal values, NaN equal to NaN (and +0 to -0)."""
    if got.dtype.is_floating_point:
        return torch.equal(torch.isnan(got), torch.isnan(expected)) and bool(
            (got[~torch.isnan(got)] == expected[~torch.isnan(expected)]).all())
    return torch.equal(got, expected)


def describe_difference(got: torch.Tensor, expected: torch.Tensor) -> str:
    bad = (got != expected)
    if got.dtype.is_floating_point:
        bad &= ~(torch.isnan(got) & torch.isnan(expected))
    idx = int(bad.nonzero()[0]) if bad.any() else -1
    return f"first difference at {idx}: got {got[idx].item()} expected {expected[idx].item()}"
