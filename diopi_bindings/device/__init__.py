"""A PyTorch device for any DIOPI library: ``enable(path)`` makes ``torch.device("diopi")`` usable.

PrivateUse1, renamed ``diopi``, registered the Python way (``torch._C._acc`` guard and hooks, a
device module ``torch.diopi``); tensors keep their memory in host memory; streams are no-ops;
operators the library implements run there, the others on the CPU (logged once per operator).
"""
from __future__ import annotations

import os
import threading
from collections import Counter

import torch

from diopi_bindings.device.module_base import DeviceModuleBase
from diopi_bindings.device.native import NativeDeviceError, enable_native, native_router
from diopi_bindings.device.router import DEVICE_TYPE, Router
from diopi_bindings.device.tensor import DiopiTensor, current_router, is_device_tensor, set_router
from diopi_bindings.device_memory import DeviceMemory
from diopi_bindings.library import DiopiLibrary, load

__all__ = ["BACKEND_ENV", "DEVICE_TYPE", "DiopiDeviceError", "DiopiTensor", "backend", "enable", "is_enabled",
           "library", "routed_ops", "fallback_ops", "copy_ops"]

# Which device serves the library: "native" (the C++ device over the library's device-memory
# functions), "python" (host memory standing in for device memory, any library), or "auto" (the
# default): native when the library exports the device-memory functions, else python.
BACKEND_ENV = "DIOPI_DEVICE_BACKEND"
BACKENDS = ("auto", "native", "python")
DEFAULT_BACKEND = "auto"

_lock = threading.Lock()
_registration: torch.library.Library | None = None


class DiopiDeviceError(RuntimeError):
    """The diopi device cannot be set up in this process."""


class _DeviceModule(DeviceModuleBase):
    """``torch.diopi``: the runtime calls torch and ditorch look up for a device type."""

    # Device tensors keep their memory in host tensors, not in torch storages of this device type:
    # whatever restores storages (torch.load) must load on the CPU and move the tensors.
    tensors_without_storage = True

    class Stream:  # streams are no-ops: every operator completes before it returns
        def __init__(self, device: object = None, priority: int = 0) -> None:
            self.device = torch.device(DEVICE_TYPE, 0)

        def synchronize(self) -> None:
            pass

        def wait_stream(self, other: object) -> None:
            pass

        def query(self) -> bool:
            return True

    @staticmethod
    def device_count() -> int:
        return 1

    @staticmethod
    def current_device() -> int:
        return 0

    @staticmethod
    def set_device(index: int) -> None:
        if int(index) != 0:
            raise RuntimeError(f"diopi device index {index} out of range: this host has 1 diopi device (index 0)")

    @staticmethod
    def synchronize(device: object = None) -> None:
        pass

    @staticmethod
    def current_stream(device: object = None) -> "_DeviceModule.Stream":
        return _DeviceModule.Stream()

    @staticmethod
    def manual_seed(seed: int) -> None:  # random numbers come from the CPU generator
        torch.default_generator.manual_seed(int(seed))  # not torch.manual_seed: it calls back here

    manual_seed_all = manual_seed

    @staticmethod
    def get_rng_state(device: object = None) -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state: torch.Tensor, device: object = None) -> None:
        torch.set_rng_state(state)


def _wrap(host: torch.Tensor) -> DiopiTensor:
    return DiopiTensor(host)


# Factories that would otherwise allocate an empty device tensor and fill it through an out= variant
# that resizes it (arange, linspace...): run on the CPU, with its generator, and move the result.
_FACTORY_SKIP = ("tensor", "as_tensor", "Generator", "empty", "sparse", "_sparse", "_empty", "_make", "_cudnn",
                 "_efficient", "from_file")


def _factory_ops() -> list[str]:
    names = []
    for schema in torch._C._jit_get_all_schemas():
        base = schema.name.removeprefix("aten::")
        if (schema.name.startswith("aten::") and not base.startswith(_FACTORY_SKIP)
                and any(a.name == "device" for a in schema.arguments)
                and not any("Tensor" in str(a.type) for a in schema.arguments)
                and not any(r.alias_info for r in schema.returns)):
            names.append(base + (f".{schema.overload_name}" if schema.overload_name else ""))
    return names


def _factory_kernel(name: str):
    packet, _, overload = name.partition(".")
    op = getattr(getattr(torch.ops.aten, packet), overload or "default")

    def kernel(*args, **kwargs):
        kwargs["device"] = torch.device("cpu")
        return _wrap(op(*args, **kwargs))

    return kernel


# Operators autocast runs in the lower precision (CUDA's lower_precision_fp list, the matrix products).
_AUTOCAST_LOWER_PRECISION = ("mm", "bmm", "addmm", "baddbmm", "linear", "matmul")
_AUTOCAST_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)


def _autocast_kernel(name: str):
    op = getattr(torch.ops.aten, name).default

    def kernel(*args, **kwargs):
        dtype = torch.get_autocast_dtype(DEVICE_TYPE)

        def cast(x):
            return x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x

        with torch._C._ExcludeDispatchKeyGuard(_AUTOCAST_KEYS):
            return op(*[cast(a) for a in args], **{k: cast(v) for k, v in kwargs.items()})

    return kernel


def _register_backend() -> None:
    """Once per process: rename PrivateUse1 and teach torch how to allocate device tensors."""
    global _registration
    if native_router() is not None:
        raise DiopiDeviceError("the native diopi device is already enabled in this process")
    current = torch._C._get_privateuse1_backend_name()
    if current not in ("privateuseone", DEVICE_TYPE):
        raise DiopiDeviceError(f"PrivateUse1 is already the {current!r} device in this process (a vendor plug-in "
                               f"claimed it); the diopi device needs it")
    if current != DEVICE_TYPE:
        from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

        _setup_privateuseone_for_python_backend(DEVICE_TYPE, backend_module=_DeviceModule())
    if _registration is None:
        lib = torch.library.Library("aten", "IMPL")

        def empty_memory_format(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
            return _wrap(torch.empty(size, dtype=dtype, memory_format=memory_format or torch.contiguous_format))

        def empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
            return _wrap(torch.empty_strided(size, stride, dtype=dtype))

        def copy_from(self, dst, non_blocking=False):  # copies that bypass Python dispatch (torch.tensor)
            getattr(dst, "host", dst).copy_(getattr(self, "host", self))
            return dst

        lib.impl("_copy_from", copy_from, "PrivateUse1")
        lib.impl("empty.memory_format", empty_memory_format, "PrivateUse1")
        lib.impl("empty_strided", empty_strided, "PrivateUse1")
        for name in _factory_ops():
            lib.impl(name, _factory_kernel(name), "PrivateUse1")
        _registration = lib
        _register_autocast()


_autocast: list[torch.library.Library] = []


def _register_autocast() -> None:
    """Autocast on this device: the matrix products in the low dtype, every other operator unchanged."""
    if _autocast:
        return
    lib = torch.library.Library("aten", "IMPL")
    for name in _AUTOCAST_LOWER_PRECISION:
        lib.impl(name, _autocast_kernel(name), "AutocastPrivateUse1")
    everything = torch.library.Library("_", "IMPL")
    everything.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
    _autocast.extend((lib, everything))


def _backend_choice(requested: str | None) -> str:
    choice = (requested or os.environ.get(BACKEND_ENV) or DEFAULT_BACKEND).strip().lower()
    if choice not in BACKENDS:
        raise DiopiDeviceError(f"{BACKEND_ENV}={choice!r} is not a diopi device backend; expected one of "
                               f"{', '.join(BACKENDS)}")
    return choice


def _resolve_auto(lib: DiopiLibrary) -> str:
    """The backend "auto" picks: the one already serving this process, else native when the library can
    back it, else python."""
    if native_router() is not None:
        return "native"
    if _registration is not None or DeviceMemory.of(lib) is None:
        return "python"
    return "native"


def enable(library: str | DiopiLibrary | None = None, backend: str | None = None) -> DiopiLibrary:
    """Serve the diopi device with ``library`` (a path, else ``$DIOPI_LIBRARY``, else the reference).
    ``backend``: "auto", "native" or "python" (default ``$DIOPI_DEVICE_BACKEND``, else "auto")."""
    choice = _backend_choice(backend)
    lib = library if isinstance(library, DiopiLibrary) else load(library)
    with _lock:
        if choice == "auto":
            choice = _resolve_auto(lib)
        if choice == "native":
            if _registration is not None:
                raise DiopiDeviceError("the host-memory diopi device is already enabled in this process")
            try:
                router = enable_native(lib)
            except NativeDeviceError as exc:
                raise DiopiDeviceError(str(exc)) from None
            _register_autocast()
            set_router(router)
            return router.library
        _register_backend()
        set_router(Router(lib, _wrap, is_device_tensor))
    return lib


def backend() -> str | None:
    """The backend serving the device in this process ("python" or "native"), or None."""
    if native_router() is not None:
        return "native"
    return "python" if _registration is not None else None


def is_enabled() -> bool:
    try:
        current_router()
    except RuntimeError:
        return False
    return True


def library() -> DiopiLibrary:
    return current_router().library


def routed_ops() -> Counter:
    """ATen operators the library served, with call counts."""
    return current_router().routed


def fallback_ops() -> Counter:
    """ATen operators that ran on the CPU instead, with call counts (a snapshot)."""
    return current_router().fallback_counts()


def copy_ops() -> Counter:
    """Copies between the CPU and the device, with counts (a snapshot). The native device counts every
    tensor copy by direction ("host to device", "device to host", "device to device", "device to host
    (item)"), whoever made it, and names the fallbacks' share ("fallback to host": the CPU fallback's
    copies of device memory it reads, one per run of overlapping tensors of a storage, none for an out=
    it only writes; "fallback to device": its results and the written arguments it copied back; "operand to
    device": a CPU scalar tensor moved for a call).
    The host-memory device counts the ATen copies that cross (``aten::_to_copy``, ``aten::copy_``,
    ``aten::_local_scalar_dense``) and "to device"."""
    return current_router().copy_counts()
