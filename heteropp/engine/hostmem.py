"""Hand freed host memory back to the operating system.

glibc keeps freed heap pages for reuse, so on CPU a stage's resident set would still count the parameters'
original storage after the optimizer moved them into its flat buffer. On CPU the resident set is the memory a
stage holds (what the step log's peak_memory_gb reports and what HeteroAuto's memory model is checked against).
Without glibc (no malloc_trim) this does nothing."""
from __future__ import annotations

import ctypes
import ctypes.util
from functools import lru_cache
from typing import Any


@lru_cache(maxsize=1)
def _malloc_trim() -> Any:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def release_freed_memory() -> None:
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
