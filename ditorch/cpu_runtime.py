"""Runtime of the CPU: one device, host-timed events, memory statistics from a counting layer over torch's CPU
allocator (`ditorch.cpu_memory`; 0 where it is not built or is switched off)."""
from __future__ import annotations

import contextlib
import time
from typing import Any

import torch

from ditorch import cpu_memory


class CpuEvent:
    """An event for the CPU with the CUDA event interface; times come from the host clock.

    CPU work is synchronous, so the moment ``record()`` returns is when prior work finished.
    """

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        self.enable_timing = enable_timing
        self._time: float | None = None

    def record(self, stream: Any = None) -> None:
        self._time = time.perf_counter()

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None

    def wait(self, stream: Any = None) -> None:
        return None

    def elapsed_time(self, end_event: "CpuEvent") -> float:
        """Milliseconds from this event to ``end_event``, like ``torch.cuda.Event.elapsed_time``."""
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("elapsed_time needs both events created with enable_timing=True")
        if self._time is None or end_event._time is None:
            raise RuntimeError("elapsed_time needs both events recorded first")
        return (end_event._time - self._time) * 1000.0


class CpuRuntime:
    """The CPU as a device: index 0 only; memory statistics are the live tensor storage counted since the
    runtime was created. There is no cache, so reserved equals allocated and `empty_cache` has nothing to do."""

    device_type = "cpu"
    Stream = torch.cpu.Stream
    Event = CpuEvent

    def __init__(self) -> None:
        cpu_memory.install()

    def is_available(self) -> bool:
        return True

    def count(self) -> int:
        return 1

    def current(self) -> int:
        return 0

    def set(self, index: int) -> None:
        if int(index) != 0:
            raise ValueError(f"the CPU device has index 0 only; got set({index})")

    def synchronize(self, index: int | None = None) -> None:
        return None

    def current_stream(self, index: int | None = None) -> Any:
        return torch.cpu.current_stream()

    def stream(self, stream: Any) -> contextlib.AbstractContextManager:
        return torch.cpu.stream(stream)

    def memory_allocated(self, index: int | None = None) -> int:
        return cpu_memory.allocated()

    def max_memory_allocated(self, index: int | None = None) -> int:
        return cpu_memory.peak()

    def memory_reserved(self, index: int | None = None) -> int:
        return cpu_memory.allocated()

    def max_memory_reserved(self, index: int | None = None) -> int:
        return cpu_memory.peak()

    def reset_peak_memory_stats(self, index: int | None = None) -> None:
        cpu_memory.reset_peak()

    def empty_cache(self) -> None:
        return None

    # The default generator directly: torch.manual_seed also seeds torch.cuda, which CUDA
    # compatibility routes back here.
    def manual_seed(self, seed: int) -> None:
        torch.default_generator.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.default_generator.manual_seed(seed)

    def get_rng_state(self, index: int | None = None) -> torch.Tensor:
        return torch.default_generator.get_state()

    def set_rng_state(self, state: torch.Tensor, index: int | None = None) -> None:
        torch.default_generator.set_state(state)

    def is_bf16_supported(self) -> bool:
        from ditorch.runtime import runs_bfloat16

        return runs_bfloat16("cpu")
