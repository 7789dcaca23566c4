"""``ditorch.device``: one runtime namespace whatever the vendor."""
from __future__ import annotations

import contextlib
from typing import Any

import torch

from ditorch import shim


class DeviceNamespace:
    """Runtime calls of the chosen vendor's device, named like ``torch.cuda``'s."""

    @property
    def type(self) -> str:
        """The torch device type behind ``"device"`` (``"cuda"``, ``"npu"``, ``"cpu"``...)."""
        return shim.current_adapter().device_type

    @property
    def vendor(self) -> str:
        return shim.current_adapter().name

    @property
    def backend(self) -> str:
        """The torch.distributed backend for collectives among chips of this vendor."""
        return shim.current_adapter().backend

    @property
    def autocast_device_type(self) -> str:
        return shim.current_adapter().autocast_device_type

    def obj(self, index: int | None = None) -> torch.device:
        return shim.device_obj(index)

    def is_available(self) -> bool:
        return shim.runtime().is_available()

    def count(self) -> int:
        return shim.runtime().count()

    def current(self) -> int:
        return shim.runtime().current()

    def set(self, index: int) -> None:
        shim.runtime().set(index)

    def synchronize(self, index: int | None = None) -> None:
        shim.runtime().synchronize(index)

    @property
    def Stream(self) -> type:  # noqa: N802 - a class, as torch.cuda.Stream
        return shim.runtime().Stream

    @property
    def Event(self) -> type:  # noqa: N802 - a class, as torch.cuda.Event
        return shim.runtime().Event

    def current_stream(self, index: int | None = None) -> Any:
        return shim.runtime().current_stream(index)

    def stream(self, stream: Any) -> contextlib.AbstractContextManager:
        return shim.runtime().stream(stream)

    def memory_allocated(self, index: int | None = None) -> int:
        return shim.runtime().memory_allocated(index)

    def max_memory_allocated(self, index: int | None = None) -> int:
        return shim.runtime().max_memory_allocated(index)

    def memory_reserved(self, index: int | None = None) -> int:
        return shim.runtime().memory_reserved(index)

    def max_memory_reserved(self, index: int | None = None) -> int:
        return shim.runtime().max_memory_reserved(index)

    def reset_peak_memory_stats(self, index: int | None = None) -> None:
        shim.runtime().reset_peak_memory_stats(index)

    def empty_cache(self) -> None:
        shim.runtime().empty_cache()

    def manual_seed(self, seed: int) -> None:
        shim.runtime().manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        shim.runtime().manual_seed_all(seed)

    def autocast(self, dtype: torch.dtype | None = None, enabled: bool = True,
                 cache_enabled: bool | None = None) -> torch.autocast:
        """``torch.autocast`` for this vendor's autocast device type."""
        return torch.autocast(self.autocast_device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    def __repr__(self) -> str:
        adapter = shim.current_adapter()
        return f"<ditorch.device vendor={adapter.name} type={adapter.device_type} backend={adapter.backend}>"


device = DeviceNamespace()
