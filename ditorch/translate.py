"""Mapping device arguments: the unified name "device" (and, opt-in, CUDA spellings) to the
chosen vendor's real device. Shared by both ways of intercepting torch calls (patches, mode)."""
from __future__ import annotations

from typing import Any, Callable

import torch

DEVICE_NAME = "device"
DEVICE_CLASSES = (str, torch.device, int)
MISS = object()
SAME = object()  # cache value for "not ours, pass through unchanged"
_CACHE_LIMIT = 4096


class DeviceTranslator:
    """Translates device arguments; remembers each distinct argument so repeats cost one dict lookup."""

    def __init__(self, device_type: str, single_device: bool) -> None:
        self.device_type = device_type
        self.single_device = single_device  # the CPU: every index means the one device
        self.cuda_compat = False
        self.device_count: Callable[[], int] = lambda: 1
        self.cache: dict[Any, Any] = {}

    def configure(self, device_type: str, single_device: bool, cuda_compat: bool) -> None:
        self.device_type = device_type
        self.single_device = single_device
        self.cuda_compat = cuda_compat
        self.cache.clear()

    def target(self, index: int | None) -> str:
        if index is None:
            return self.device_type
        count = self.device_count()
        if not 0 <= index < count:
            raise ValueError(f"device index {index} is out of range: this host has {count} {self.device_type} "
                             f"device{'s' if count != 1 else ''} (indices 0 to {count - 1})")
        return self.device_type if self.single_device else f"{self.device_type}:{index}"

    def translate(self, dev: Any) -> Any:
        """The real device for a device argument, or ``dev`` itself when it is not ours."""
        if dev.__class__ is str:
            for prefix, active in ((DEVICE_NAME, True), ("cuda", self.cuda_compat)):
                if active and (dev == prefix or dev.startswith(prefix + ":")):
                    index = dev[len(prefix) + 1 :]
                    if index and not index.isdigit():
                        raise ValueError(f"bad device {dev!r}: expected {prefix!r} or '{prefix}:<index>'")
                    return self.target(int(index) if index else None)
            return dev
        if self.cuda_compat and dev.__class__ is torch.device and dev.type == "cuda":
            return torch.device(self.target(dev.index))
        if self.cuda_compat and dev.__class__ is int:
            return torch.device(self.target(dev))
        return dev

    def lookup(self, dev: Any) -> Any:
        """``SAME`` when ``dev`` passes through unchanged, else the real device."""
        new = self.cache.get(dev, MISS)
        if new is MISS:
            translated = self.translate(dev)
            new = SAME if translated is dev else translated
            if len(self.cache) >= _CACHE_LIMIT:
                self.cache.clear()
            self.cache[dev] = new
        return new

    def cuda_call(self, to: Any, tensor: torch.Tensor, args: tuple, kwargs: dict[str, Any]) -> torch.Tensor:
        """``Tensor.cuda(device=None, non_blocking=False, memory_format=...)`` as ``Tensor.to(vendor)``."""
        device = kwargs.pop("device", args[0] if args else None)
        if len(args) > 1:
            kwargs.setdefault("non_blocking", args[1])
        target = torch.device(self.target(None)) if device is None else self.lookup(device)
        if target is SAME:  # e.g. .cuda(torch.device("npu", 1)): an explicit non-CUDA device
            target = device
        return to(tensor, target, **kwargs)
