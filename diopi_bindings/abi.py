"""The C structs of ``diopi/diopirt.h`` as ctypes types, and torch tensors as DIOPI tensor handles."""
from __future__ import annotations

import ctypes
import re
import threading
from pathlib import Path
from typing import Any

import torch

INCLUDE_DIR = Path(__file__).resolve().parent / "include"


def _header_macro(name: str) -> int:
    text = (INCLUDE_DIR / "diopi" / "diopirt.h").read_text()
    match = re.search(rf"#define {name} (\d+)", text)
    if match is None:
        raise RuntimeError(f"diopirt.h defines no {name}")
    return int(match.group(1))


# One source of truth: the header the libraries are compiled against.
ABI_VERSION = _header_macro("DIOPI_ABI_VERSION")
VERSION = ".".join(str(_header_macro(f"DIOPI_VERSION_{p}")) for p in ("MAJOR", "MINOR", "PATCH"))

SUCCESS = 0
ERR_INVALID_ARGUMENT, ERR_DTYPE, ERR_ALLOCATION = 2, 3, 4  # diopiError_t (diopirt.h)
ERROR_NAMES = {0: "success", 1: "not implemented", 2: "invalid argument", 3: "unsupported dtype",
               4: "allocation failed", 5: "internal error"}

DTYPE_CODES: dict[torch.dtype, int] = {
    torch.bool: 0, torch.int32: 1, torch.int64: 2, torch.float16: 3, torch.bfloat16: 4,
    torch.float32: 5, torch.float64: 6,
}
DTYPE_NAMES: dict[str, torch.dtype] = {
    "bool": torch.bool, "int32": torch.int32, "int64": torch.int64, "float16": torch.float16,
    "bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64,
}
DEVICE_HOST, DEVICE_DEVICE = 0, 1


class DtypeError(TypeError):
    """A tensor whose dtype the ABI has no code for (uint8, int8, int16, complex...): no library can take it."""


class Tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("ndim", ctypes.c_int64),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("dtype", ctypes.c_int),
        ("device", ctypes.c_int),
    ]


class Size(ctypes.Structure):
    _fields_ = [("data", ctypes.POINTER(ctypes.c_int64)), ("len", ctypes.c_int64)]


class TensorList(ctypes.Structure):
    _fields_ = [("data", ctypes.POINTER(ctypes.c_void_p)), ("len", ctypes.c_int64)]


ALLOCATE = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
RELEASE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)
REQUIRE_TENSOR = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.POINTER(Tensor)),
                                  ctypes.c_int64, ctypes.POINTER(ctypes.c_int64), ctypes.c_int)


class Context(ctypes.Structure):
    _fields_ = [
        ("stream", ctypes.c_void_p),
        ("allocator_state", ctypes.c_void_p),
        ("allocate", ALLOCATE),
        ("release", RELEASE),
        ("require_tensor", REQUIRE_TENSOR),
    ]


class HostAllocator:
    """The framework side of a context: memory for kernels comes from torch and stays alive until
    released. A tensor a kernel requires (an ``out*`` output) is allocated where the call's outputs live
    (``expect``) and handed back to the caller by ``take`` after the call."""

    def __init__(self) -> None:
        self.blocks: dict[int, torch.Tensor] = {}
        self._call = threading.local()  # per thread: the device of required tensors, and those made
        # How many threads hold tensors required during a call not yet done(): a plain int, read per call.
        # One thread's done() must not hide another's tensors, which would then outlive their call.
        self.pending = 0
        self._pending_lock = threading.Lock()
        self._callbacks = (ALLOCATE(self._allocate), RELEASE(self._release), REQUIRE_TENSOR(self._require))
        self.context = Context(None, None, *self._callbacks)

    def _allocate(self, _state: Any, nbytes: int) -> int:
        block = torch.empty(max(int(nbytes), 1), dtype=torch.uint8)
        self.blocks[block.data_ptr()] = block
        return block.data_ptr()

    def _release(self, _state: Any, ptr: int) -> None:
        self.blocks.pop(ptr or 0, None)

    def expect(self, device: torch.device | None) -> None:
        """The next call's required tensors are made on ``device`` (None: the CPU)."""
        self._call.device = device
        self.done()

    def take(self, holder: Any) -> torch.Tensor | None:
        """The tensor whose handle the kernel stored in ``holder`` (a ``POINTER(Tensor)``), or None."""
        made = getattr(self._call, "made", {})
        if not holder:
            return None
        hit = made.get(ctypes.addressof(holder.contents))
        return None if hit is None else hit[0]

    def done(self) -> None:
        """Drops the tensors required during this thread's call that nobody took (a kernel's scratch tensors)."""
        if getattr(self._call, "made", None):
            with self._pending_lock:
                self.pending -= 1
        self._call.made = {}

    def holds_required(self) -> bool:
        return bool(getattr(self._call, "made", None))

    def _require(self, _state: Any, out: Any, ndim: int, shape: Any, dtype: int) -> int:
        torch_dtype = next((d for d, c in DTYPE_CODES.items() if c == dtype), None)
        if torch_dtype is None:
            return ERR_DTYPE
        if ndim < 0 or ndim > MAX_NDIM or not out or any(shape[i] < 0 for i in range(ndim)):
            return ERR_INVALID_ARGUMENT
        device = getattr(self._call, "device", None)
        try:
            tensor = torch.empty([shape[i] for i in range(ndim)], dtype=torch_dtype, device=device or "cpu")
        except RuntimeError:
            return ERR_ALLOCATION
        handle = TensorHandle(tensor, DEVICE_HOST if tensor.is_cpu else DEVICE_DEVICE)
        made = getattr(self._call, "made", None)
        if not made:
            self._call.made = made = {}
            with self._pending_lock:
                self.pending += 1
        made[ctypes.addressof(handle.struct)] = (tensor, handle)
        out[0] = ctypes.pointer(handle.struct)
        return SUCCESS


class TensorHandle:
    """A ``diopiTensor`` viewing a torch tensor's memory (kept alive as long as the handle)."""

    __slots__ = ("tensor", "shape", "strides", "struct")

    def __init__(self, tensor: torch.Tensor, device: int = DEVICE_HOST) -> None:
        code = DTYPE_CODES.get(tensor.dtype)
        if code is None:
            raise DtypeError(f"dtype {tensor.dtype} has no DIOPI code; expected one of {sorted(map(str, DTYPE_CODES))}")
        ndim = tensor.dim()
        self.tensor = tensor
        self.shape = (ctypes.c_int64 * ndim)(*tensor.shape)
        self.strides = (ctypes.c_int64 * ndim)(*tensor.stride())
        self.struct = Tensor(tensor.data_ptr(), ndim, self.shape, self.strides, code, device)


MAX_NDIM = 16


class HandleSlots(threading.local):
    """Preallocated ``diopiTensor`` structs, refilled on every call: building ctypes objects per call
    costs more than the operator on small tensors (bench/diopi_overhead.py). Each argument position keeps
    one struct per (sizes, strides) it met (a few: a model's shapes repeat), so a call writes only the
    data pointer, the device and, when it changed, the dtype; the last one used is checked first."""

    def __init__(self) -> None:
        # per position: [last sizes, last strides, last handle, {(sizes, strides): handle}];
        # a handle: [struct, its address, dtype, shape array, strides array]
        self.slots: list[list[Any]] = []

    @staticmethod
    def _handle(size: Any, stride: Any) -> list[Any]:
        ndim = len(size)
        if ndim > MAX_NDIM:
            raise TypeError(f"a tensor with {ndim} dims has no DIOPI handle (at most {MAX_NDIM})")
        shape, strides = (ctypes.c_int64 * max(ndim, 1))(*size), (ctypes.c_int64 * max(ndim, 1))(*stride)
        struct = Tensor(None, ndim, shape, strides, -1, DEVICE_HOST)
        return [struct, ctypes.addressof(struct), None, shape, strides]

    def fill(self, i: int, tensor: torch.Tensor) -> int:
        slots = self.slots
        while i >= len(slots):
            slots.append([None, None, None, {}])
        slot = slots[i]
        size, stride = tensor.shape, tensor.stride()
        if size == slot[0] and stride == slot[1]:
            handle = slot[2]
        else:
            known = slot[3]
            handle = known.get((size, stride))
            if handle is None:
                if len(known) >= _SHAPES_PER_SLOT:  # shapes that do not repeat: start over
                    known.clear()
                handle = known[(size, stride)] = self._handle(size, stride)
            slot[0], slot[1], slot[2] = size, stride, handle
        struct = handle[0]
        struct.data = tensor.data_ptr()
        struct.device = DEVICE_HOST if tensor.is_cpu else DEVICE_DEVICE
        dtype = tensor.dtype
        if dtype is not handle[2]:
            code = DTYPE_CODES.get(dtype)
            if code is None:
                raise DtypeError(f"dtype {dtype} has no DIOPI code; expected one of {', '.join(map(str, DTYPE_CODES))}")
            struct.dtype = code
            handle[2] = dtype
        return handle[1]


_SHAPES_PER_SLOT = 64


def size_arg(values: Any) -> Size:
    values = [int(v) for v in values]
    array = (ctypes.c_int64 * len(values))(*values)
    size = Size(array, len(values))
    size._keep = array  # the array must outlive the call
    return size
