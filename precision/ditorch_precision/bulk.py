"""Capture's bulk mode: the ops' tensors are held, uncopied, and written together in one file (at
each optimizer step, past a size, or on exit), so a tensor several ops read is written once and a
step costs one file instead of one per op.

Held tensors are guarded: before an op writes a storage that a held tensor uses, the held tensor
is copied (``guard``, called for every op that writes an argument)."""
from __future__ import annotations

import logging

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from .dump import version_of

log = logging.getLogger("precision")


def storage_address(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def tensor_key(t: torch.Tensor) -> tuple:
    """What tells two tensors apart that see the same elements in the same order."""
    return t.data_ptr(), t.dtype, tuple(t.shape), tuple(t.stride())


class PendingWrites:
    def __init__(self) -> None:
        self._items: dict[str, tuple[list, object]] = {}  # key -> (leaves, spec)
        self._held: dict[int, list[tuple[str, int, int]]] = {}  # storage -> (key, leaf, version)
        self.nbytes = 0

    def __bool__(self) -> bool:
        return bool(self._items)

    def add(self, key: str, payload, nbytes: int) -> None:
        leaves, spec = tree_flatten(payload)
        for i, leaf in enumerate(leaves):
            if isinstance(leaf, torch.Tensor) and leaf.layout == torch.strided:
                self._held.setdefault(storage_address(leaf), []).append((key, i, version_of(leaf)))
        self._items[key] = (leaves, spec)
        self.nbytes += nbytes

    def guard(self, written: list[torch.Tensor]) -> dict:
        """Copy the held tensors that share a storage with ``written``, before it is written. Returns
        the copies by ``tensor_key`` of what they copy: the writing op's own copy of its input, where
        it is one of them."""
        copies = {}
        for t in written:
            for key, i, _ in self._held.pop(storage_address(t), ()):
                leaves = self._items[key][0]
                copy = leaves[i].clone()
                copies[tensor_key(leaves[i])] = copy
                leaves[i] = copy
        return copies

    def storages(self) -> set[int]:
        """The storage addresses of the held tensors that are the program's own (not copies)."""
        return set(self._held)

    def take(self) -> dict:
        """The held payloads by key (and forget them)."""
        for entries in self._held.values():
            for key, i, version in entries:
                # changed by a write no op showed (an inference tensor keeps no version: not known)
                if version is not None and version_of(self._items[key][0][i]) != version:
                    log.warning("capture: a tensor of op %s changed before it was written", key)
        out = {key: tree_unflatten(leaves, spec) for key, (leaves, spec) in self._items.items()}
        self._items, self._held, self.nbytes = {}, {}, 0
        return out
