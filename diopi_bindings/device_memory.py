"""The optional device-memory functions of the DIOPI ABI (``diopirt.h``), from Python.

A library that exports all of them can back a real torch device (``diopi_bindings._C_device``); one
that lacks any is served by the host-memory stand-in. Every call checks the error code and raises
``OperatorError`` with the library's message.
"""
from __future__ import annotations

import ctypes
from typing import Any

from diopi_bindings.library import DiopiLibrary, OperatorError

_I32, _I64, _PTR = ctypes.c_int32, ctypes.c_int64, ctypes.c_void_p
# name -> argument types (every function returns diopiError_t).
SIGNATURES: dict[str, tuple[Any, ...]] = {
    "diopi_device_count": (ctypes.POINTER(_I32),),
    "diopi_set_device": (_I32,),
    "diopi_get_device": (ctypes.POINTER(_I32),),
    "diopi_device_malloc": (_I32, _I64, ctypes.POINTER(_PTR)),
    "diopi_device_free": (_I32, _PTR),
    "diopi_memcpy_h2d": (_I32, _PTR, _PTR, _I64),
    "diopi_memcpy_d2h": (_I32, _PTR, _PTR, _I64),
    "diopi_memcpy_d2d": (_I32, _PTR, _I32, _PTR, _I64),
    "diopi_device_synchronize": (_I32,),
}

# Optional, all or none (diopirt.h): a library whose operators run asynchronously on streams.
STREAM_FUNCTIONS = ("diopi_stream_create", "diopi_stream_destroy", "diopi_stream_synchronize", "diopi_stream_query",
                    "diopi_memcpy_h2d_async", "diopi_memcpy_d2h_async", "diopi_event_create", "diopi_event_destroy",
                    "diopi_event_record", "diopi_event_query", "diopi_event_synchronize", "diopi_stream_wait_event")


class DeviceMemory:
    """The device-memory functions of one library (``DeviceMemory.of(lib)`` is None without them)."""

    def __init__(self, lib: DiopiLibrary, functions: dict[str, Any]) -> None:
        self.lib = lib
        self._fn = functions

    @classmethod
    def missing(cls, lib: DiopiLibrary) -> list[str]:
        return [name for name in SIGNATURES if not hasattr(lib._dll, name)]

    @classmethod
    def of(cls, lib: DiopiLibrary) -> "DeviceMemory | None":
        if cls.missing(lib):
            return None
        functions = {}
        for name, argtypes in SIGNATURES.items():
            fn = getattr(lib._dll, name)
            fn.restype, fn.argtypes = ctypes.c_int, list(argtypes)
            functions[name] = fn
        return cls(lib, functions)

    def addresses(self) -> dict[str, int]:
        """The C function pointers, for the C++ device."""
        out = {name: int(ctypes.cast(fn, ctypes.c_void_p).value or 0) for name, fn in self._fn.items()}
        for name in STREAM_FUNCTIONS:  # the C++ device checks that all or none are there
            if hasattr(self.lib._dll, name):
                out[name] = int(ctypes.cast(getattr(self.lib._dll, name), ctypes.c_void_p).value or 0)
        return out

    def _check(self, name: str, code: int) -> None:
        if code:
            raise OperatorError(name, code, self.lib.last_error())

    def device_count(self) -> int:
        n = _I32(0)
        self._check("diopi_device_count", self._fn["diopi_device_count"](ctypes.byref(n)))
        return n.value

    def set_device(self, device: int) -> None:
        self._check("diopi_set_device", self._fn["diopi_set_device"](device))

    def get_device(self) -> int:
        n = _I32(0)
        self._check("diopi_get_device", self._fn["diopi_get_device"](ctypes.byref(n)))
        return n.value

    def malloc(self, device: int, nbytes: int) -> int:
        ptr = _PTR()
        self._check("diopi_device_malloc", self._fn["diopi_device_malloc"](device, nbytes, ctypes.byref(ptr)))
        return int(ptr.value or 0)

    def free(self, device: int, ptr: int) -> None:
        self._check("diopi_device_free", self._fn["diopi_device_free"](device, ptr))

    def memcpy_h2d(self, device: int, dst: int, src: int, nbytes: int) -> None:
        self._check("diopi_memcpy_h2d", self._fn["diopi_memcpy_h2d"](device, dst, src, nbytes))

    def memcpy_d2h(self, device: int, dst: int, src: int, nbytes: int) -> None:
        self._check("diopi_memcpy_d2h", self._fn["diopi_memcpy_d2h"](device, dst, src, nbytes))

    def memcpy_d2d(self, dst_device: int, dst: int, src_device: int, src: int, nbytes: int) -> None:
        self._check("diopi_memcpy_d2d", self._fn["diopi_memcpy_d2d"](dst_device, dst, src_device, src, nbytes))

    def synchronize(self, device: int) -> None:
        self._check("diopi_device_synchronize", self._fn["diopi_device_synchronize"](device))
