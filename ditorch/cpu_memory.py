"""Memory statistics of the CPU as a device: the bytes of live tensor storage and their peak, counted by a
layer over torch's CPU allocator (`ditorch/csrc/cpu_memory.cpp`), so that `memory_allocated` and
`max_memory_allocated` mean on the CPU what they mean on an accelerator's caching allocator. The process's
resident set is a different figure: it also holds the interpreter, the libraries and the C heap's free lists.

The layer is put in place when the CPU runtime is first used (`DITORCH_CPU_MEMORY_STATS=0` leaves torch's
allocator alone); storage allocated before that is not counted. Where the library is not built the statistics
stay 0, as they were."""
from __future__ import annotations

import ctypes
import sysconfig
from functools import lru_cache
from pathlib import Path
from typing import Any

from ditorch.env import env_flag

STATS_ENV = "DITORCH_CPU_MEMORY_STATS"
_LIBRARY = "libditorch_cpu_memory.so"


def library_path() -> Path | None:
    """The counting layer's library: in the package's `lib` folder (wheel or editable install), else None."""
    import ditorch

    roots = [Path(p) for p in getattr(ditorch, "__path__", [])]
    roots.append(Path(sysconfig.get_paths()["platlib"]) / "ditorch")
    for root in roots:
        candidate = root / "lib" / _LIBRARY
        if candidate.is_file():
            return candidate
    return None


@lru_cache(maxsize=1)
def _library() -> Any:
    path = library_path()
    if path is None:
        return None
    import torch  # noqa: F401  (c10, which the library links, must be loaded first)

    lib = ctypes.CDLL(str(path))
    for name in ("ditorch_cpu_memory_allocated", "ditorch_cpu_memory_peak"):
        getattr(lib, name).restype = ctypes.c_int64
    return lib


def install() -> bool:
    """Count the CPU allocator's storage from now on (once per process); False where it cannot or must not."""
    if not env_flag(STATS_ENV, True):
        return False
    lib = _library()
    if lib is None:
        return False
    lib.ditorch_cpu_memory_install()
    return active()


def active() -> bool:
    """Whether CPU storage is being counted now."""
    lib = _library()
    return bool(lib is not None and lib.ditorch_cpu_memory_active())


def allocated() -> int:
    """Bytes of CPU tensor storage alive now (allocated since the layer was installed); 0 when not counting."""
    return int(_library().ditorch_cpu_memory_allocated()) if active() else 0


def peak() -> int:
    """The largest `allocated()` since the layer was installed or the last `reset_peak()`."""
    return int(_library().ditorch_cpu_memory_peak()) if active() else 0


def reset_peak() -> None:
    """The peak starts again from what is allocated now."""
    if active():
        _library().ditorch_cpu_memory_reset_peak()
