"""What ``torch.diopi`` offers on both diopi devices: events timed with the host clock (the library's
operators complete before they return), a no-op stream context, availability, memory statistics the
ABI does not carry, and the autocast dtypes."""
from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import torch

from diopi_bindings.device import compile_refusal


class DeviceModuleBase:
    # Inductor's code generators for this device: refusals naming the way out (compile_refusal.py).
    Scheduling = compile_refusal.Scheduling
    PythonWrapperCodegen = compile_refusal.PythonWrapperCodegen
    CppWrapperCodegen = compile_refusal.CppWrapperCodegen
    WrapperFxCodegen = compile_refusal.WrapperFxCodegen

    class Event:  # timed with the host clock: operators are synchronous
        def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
            self.time: float | None = None

        def record(self, stream: object = None) -> None:
            self.time = time.perf_counter()

        def synchronize(self) -> None:
            pass

        def wait(self, stream: object = None) -> None:
            pass

        def query(self) -> bool:
            return True

        def elapsed_time(self, end: "DeviceModuleBase.Event") -> float:
            if self.time is None or end.time is None:
                raise RuntimeError("both events must be recorded before elapsed_time()")
            return (end.time - self.time) * 1000.0

    @staticmethod
    @contextlib.contextmanager
    def stream(stream: object = None) -> Iterator[object]:
        yield stream

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def is_initialized() -> bool:
        return True

    @staticmethod
    def _is_in_bad_fork() -> bool:
        return False

    @staticmethod
    def _lazy_init() -> None:
        pass

    # The ABI reports no memory statistics, and there is no cache to release.
    @staticmethod
    def memory_allocated(device: object = None) -> int:
        return 0

    memory_reserved = max_memory_allocated = max_memory_reserved = memory_allocated

    @staticmethod
    def reset_peak_memory_stats(device: object = None) -> None:
        pass

    @staticmethod
    def empty_cache() -> None:
        pass

    @staticmethod
    def is_bf16_supported(including_emulation: bool = True) -> bool:
        return True

    @staticmethod
    def get_amp_supported_dtype() -> list[torch.dtype]:
        return [torch.bfloat16, torch.float16]
