"""Uninitialised memory: which elements of a storage an ``empty*`` op allocated no op has written
since. A view of such a storage (DDP's gradient bucket, viewed with ``as_strided`` before the
gradients are copied in) holds whatever the allocator left there, which differs between runs and
may be NaN: no rule may judge it. A capture saves those elements as 0 in both runs."""
from __future__ import annotations

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._pytree import tree_leaves

ALLOCATORS = frozenset({"aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty",
                        "aten::new_empty_strided", "aten::empty_permuted"})


def _address(t: torch.Tensor) -> int | None:
    try:
        return t.untyped_storage().data_ptr()
    except RuntimeError:  # a wrapper subclass has no storage of its own
        return None


class Unwritten:
    """Per storage an ``empty*`` op allocated: a mask over its elements (True: not written since),
    kept while any element is unwritten. Writes are marked through any view (``as_strided``,
    slices, ``view``) by the view's sizes, strides and offset."""

    def __init__(self) -> None:
        # storage address -> (weak reference to the storage, mask over its elements, element size)
        self._masks: dict[int, tuple[StorageWeakRef, torch.Tensor, int]] = {}
        self._limit = 64

    def __bool__(self) -> bool:
        return bool(self._masks)

    def allocated(self, out) -> None:
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor) or t.layout != torch.strided or not t.numel():
                continue
            addr = _address(t)
            if addr is None or addr == 0:
                continue
            held = self._masks.get(addr)
            if held is not None and not held[0].expired():  # the same storage, seen already
                continue
            if len(self._masks) >= self._limit:  # storages freed since, never looked up again: forget them
                self._masks = {k: v for k, v in self._masks.items() if not v[0].expired()}
                self._limit = max(64, 2 * len(self._masks))
            n = t.untyped_storage().nbytes() // t.element_size()
            self._masks[addr] = (StorageWeakRef(t.untyped_storage()), torch.ones(n, dtype=torch.bool),
                                 t.element_size())

    def _entry(self, t: torch.Tensor):
        if t.layout != torch.strided:
            return None
        addr = _address(t)
        held = self._masks.get(addr) if addr is not None else None
        if held is None:
            return None
        if held[0].expired():  # freed; the address may be another storage's now
            del self._masks[addr]
            return None
        return addr, held

    def written(self, tensors) -> None:
        """The op that is running (or just ran) writes these tensors."""
        for t in tensors:
            hit = self._entry(t)
            if hit is None:
                continue
            addr, (_, mask, size) = hit
            if t.element_size() != size:  # a view in another dtype: its elements are not the mask's
                del self._masks[addr]
                continue
            mask.as_strided(t.shape, t.stride(), t.storage_offset()).fill_(False)
            if not mask.any():
                del self._masks[addr]

    def mask(self, t: torch.Tensor) -> torch.Tensor | None:
        """The tensor's elements no op has written since its storage was allocated (True), or None
        when every one has been."""
        hit = self._entry(t)
        if hit is None or t.element_size() != hit[1][2]:
            return None
        m = hit[1][1].as_strided(t.shape, t.stride(), t.storage_offset())
        return m.clone() if m.any() else None
