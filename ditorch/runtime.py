"""Runtime calls of one device type: torch.accelerator where torch has it, else torch.<type>."""
from __future__ import annotations

import contextlib
from typing import Any, Protocol

import torch


class Runtime(Protocol):
    """What ditorch needs from a vendor's runtime; ``ditorch.device`` forwards to it."""

    device_type: str

    def is_available(self) -> bool: ...
    def count(self) -> int: ...
    def current(self) -> int: ...
    def set(self, index: int) -> None: ...
    def synchronize(self, index: int | None = None) -> None: ...
    @property
    def Stream(self) -> type: ...  # noqa: N802 - mirrors torch.cuda.Stream
    @property
    def Event(self) -> type: ...  # noqa: N802 - mirrors torch.cuda.Event
    def current_stream(self, index: int | None = None) -> Any: ...
    def stream(self, stream: Any) -> contextlib.AbstractContextManager: ...
    def memory_allocated(self, index: int | None = None) -> int: ...
    def max_memory_allocated(self, index: int | None = None) -> int: ...
    def memory_reserved(self, index: int | None = None) -> int: ...
    def max_memory_reserved(self, index: int | None = None) -> int: ...
    def reset_peak_memory_stats(self, index: int | None = None) -> None: ...
    def empty_cache(self) -> None: ...
    def manual_seed(self, seed: int) -> None: ...
    def manual_seed_all(self, seed: int) -> None: ...
    def get_rng_state(self, index: int | None = None) -> torch.Tensor: ...
    def set_rng_state(self, state: torch.Tensor, index: int | None = None) -> None: ...
    def is_bf16_supported(self) -> bool: ...


class AcceleratorRuntime:
    """Runtime of an accelerator device type (cuda, npu, mlu, musa, xpu, mps...).

    Device-agnostic calls go through ``torch.accelerator`` when it drives this device type; the
    rest (stream and event classes, seeding) come from the vendor's ``torch.<type>`` module.
    """

    def __init__(self, device_type: str) -> None:
        self.device_type = device_type

    @property
    def module(self) -> Any:
        module = getattr(torch, self.device_type, None)
        if module is None:
            raise RuntimeError(
                f"torch.{self.device_type} does not exist: the vendor plug-in for the "
                f"'{self.device_type}' device type is not loaded"
            )
        return module

    def _accel(self) -> Any | None:
        # torch.accelerator only drives the one accelerator torch considers current.
        accel = getattr(torch, "accelerator", None)
        if accel is None:
            return None
        current = accel.current_accelerator()
        return accel if current is not None and current.type == self.device_type else None

    def _call(self, name: str, *args: Any) -> Any:
        accel = self._accel()
        if accel is not None and hasattr(accel, name):
            return getattr(accel, name)(*args)
        return getattr(self.module, name)(*args)

    def is_available(self) -> bool:
        module = getattr(torch, self.device_type, None)
        return bool(module is not None and module.is_available())

    def count(self) -> int:
        return int(self._call("device_count"))

    def current(self) -> int:
        accel = self._accel()
        if accel is not None:
            return int(accel.current_device_index())
        return int(self.module.current_device())

    def set(self, index: int) -> None:
        accel = self._accel()
        if accel is not None:
            accel.set_device_index(index)
        else:
            self.module.set_device(index)

    def synchronize(self, index: int | None = None) -> None:
        self._call("synchronize", index)

    @property
    def Stream(self) -> type:  # noqa: N802
        return self.module.Stream

    @property
    def Event(self) -> type:  # noqa: N802
        return self.module.Event

    def current_stream(self, index: int | None = None) -> Any:
        return self._call("current_stream", index)

    def stream(self, stream: Any) -> contextlib.AbstractContextManager:
        return self.module.stream(stream)

    def memory_allocated(self, index: int | None = None) -> int:
        return int(self._call("memory_allocated", index))

    def max_memory_allocated(self, index: int | None = None) -> int:
        return int(self._call("max_memory_allocated", index))

    def memory_reserved(self, index: int | None = None) -> int:
        return int(self._call("memory_reserved", index))

    def max_memory_reserved(self, index: int | None = None) -> int:
        return int(self._call("max_memory_reserved", index))

    def reset_peak_memory_stats(self, index: int | None = None) -> None:
        self._call("reset_peak_memory_stats", index)

    def empty_cache(self) -> None:
        self._call("empty_cache")

    def manual_seed(self, seed: int) -> None:
        self.module.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        self.module.manual_seed_all(seed)

    def get_rng_state(self, index: int | None = None) -> torch.Tensor:
        return self.module.get_rng_state(self.device_type if index is None else index)

    def set_rng_state(self, state: torch.Tensor, index: int | None = None) -> None:
        self.module.set_rng_state(state, self.device_type if index is None else index)

    def is_bf16_supported(self) -> bool:
        """The vendor module's answer, else whether a bfloat16 operation runs on the device."""
        check = getattr(self.module, "is_bf16_supported", None)
        if check is not None:
            return bool(check())
        return runs_bfloat16(self.device_type)


def runs_bfloat16(device_type: str) -> bool:
    try:
        return float((torch.ones(2, dtype=torch.bfloat16, device=device_type) * 2).sum()) == 4.0
    except RuntimeError:
        return False
