"""Deterministic initialisation: a parameter's full value depends only on (seed, global layer, name).

Every rank builds the full tensor and keeps its own shard, so any plan (any TP size, any layer split)
starts from exactly the weights of the single-process reference.
"""
from __future__ import annotations

import hashlib

import torch

EMBED_LAYER = -1  # the embedding's "layer index"; the head uses the model's layer count
_SKIP = False  # skip_init() is open


class skip_init:
    """Inside it full_init returns uninitialised memory: the values are about to be loaded (HF weights), and
    untouched pages of the full tensor never become resident, so a rank's memory stays close to its shard."""

    def __enter__(self) -> "skip_init":
        global _SKIP
        _SKIP = True
        return self

    def __exit__(self, *exc: object) -> None:
        global _SKIP
        _SKIP = False


def _generator(seed: int, layer: int, name: str) -> torch.Generator:
    digest = hashlib.sha256(f"{seed}/{layer}/{name}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))


def full_init(seed: int, layer: int, name: str, shape: tuple[int, ...], std: float | None) -> torch.Tensor:
    """Normal(0, std) for weights, ones for norms (std=None)."""
    if _SKIP:
        return torch.empty(shape)
    if std is None:
        return torch.ones(shape)
    return torch.randn(shape, generator=_generator(seed, layer, name)) * std


def shard(full: torch.Tensor, dim: int | None, rank: int, size: int, replicas: int = 1) -> torch.Tensor:
    """This TP rank's contiguous slice along `dim` (None: replicated). `replicas` consecutive TP ranks
    share one slice (key/value heads when TP exceeds their number), so there are size // replicas slices."""
    if dim is None or size == 1:
        return full.clone()
    parts = size // replicas
    if size % replicas or full.shape[dim] % parts:
        raise ValueError(f"cannot split dim {dim} of size {full.shape[dim]} over {size} TP ranks"
                         + (f" in {replicas}-fold replicated slices" if replicas > 1 else ""))
    return full.chunk(parts, dim)[rank // replicas].clone()


def global_slice(p: torch.Tensor, tp_rank: int, tp_size: int) -> tuple[tuple[int, ...], int | None, int, int]:
    """Where a parameter built by `shard` sits in its full tensor: (full shape, split dim or None, start, stop
    along that dim). Reads the `shard_dim` / `tp_replicas` marks every layer puts on its parameters."""
    dim, replicas = getattr(p, "shard_dim", None), getattr(p, "tp_replicas", 1)
    shape = tuple(p.shape)
    if dim is None or tp_size == 1:
        return shape, None, 0, shape[0] if shape else 0
    parts, n = tp_size // replicas, shape[dim]
    full = shape[:dim] + (n * parts,) + shape[dim + 1:]
    start = (tp_rank // replicas) * n
    return full, dim, start, start + n
