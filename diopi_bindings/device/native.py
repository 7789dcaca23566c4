"""The native diopi device: PrivateUse1 made a device in C++ (``diopi_bindings._C_device``) over the
library's device-memory functions. The library's operators get a C++ kernel each (``_C_diopi``, own_router.cpp),
registered once per ATen overload from the router's plan; every other operator reaches the boxed fallback in C++
(``_C_diopi``, cpu_fallback.cpp).

Compared with the host-memory stand-in: tensors have real storages of this device (allocated by
``diopi_device_malloc``), several devices (``"diopi:1"`` is another device with its own memory), a
default generator per device (``torch.Generator(device="diopi")`` works), and the device can be
enabled after the process already ran a backward pass on the CPU.
"""
from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import torch

from diopi_bindings.device.module_base import DeviceModuleBase
from diopi_bindings.device.native_router import NativeRouter
from diopi_bindings.device.router import DEVICE_TYPE
from diopi_bindings.device_memory import DeviceMemory
from diopi_bindings.library import DiopiLibrary
from diopi_bindings.schema import BY_NAME

logger = logging.getLogger("diopi_bindings")


class NativeDeviceError(RuntimeError):
    """The native device cannot serve this library or this process."""


def _runtime() -> Any:
    from diopi_bindings import _C_device

    return _C_device


class NativeDeviceModule(DeviceModuleBase):
    """``torch.diopi`` for the native device: the runtime calls torch and ditorch look up."""

    tensors_without_storage = False

    # The library's streams and events when it exports them (torch.Stream / torch.Event over the device
    # guard, csrc/streams.cpp); else one stream per device and events complete when recorded.
    class Stream(torch.Stream):
        def __new__(cls, device: Any = None, priority: int = 0) -> "NativeDeviceModule.Stream":
            return super().__new__(cls, device=torch.device(DEVICE_TYPE, _index(device)), priority=priority)

    class Event(torch.Event):
        def __new__(cls, enable_timing: bool = False, blocking: bool = False,
                    interprocess: bool = False) -> "NativeDeviceModule.Event":
            if enable_timing:  # the runtime interface has no device timer
                return DeviceModuleBase.Event(enable_timing, blocking, interprocess)  # type: ignore[return-value]
            return super().__new__(cls, device=DEVICE_TYPE, blocking=blocking, interprocess=interprocess)

    @staticmethod
    @contextlib.contextmanager
    def stream(stream: Any = None) -> Iterator[Any]:
        if stream is None:
            yield stream
            return
        previous = torch.accelerator.current_stream(stream.device)
        torch.accelerator.set_stream(stream)
        try:
            yield stream
        finally:
            torch.accelerator.set_stream(previous)

    @staticmethod
    @contextlib.contextmanager
    def device(index: Any) -> Iterator[None]:
        previous = _runtime().current_device()
        NativeDeviceModule.set_device(index)
        try:
            yield
        finally:
            _runtime().set_device(previous)

    @staticmethod
    def device_count() -> int:
        return int(_runtime().device_count())

    @staticmethod
    def current_device() -> int:
        return int(_runtime().current_device())

    @staticmethod
    def set_device(index: Any) -> None:
        if isinstance(index, (str, torch.device)):
            index = torch.device(index).index or 0
        _runtime().set_device(int(index))

    @staticmethod
    def synchronize(device: Any = None) -> None:
        index = _index(device)
        _runtime().synchronize(index)

    @staticmethod
    def current_stream(device: Any = None) -> torch.Stream:
        return torch.accelerator.current_stream(torch.device(DEVICE_TYPE, _index(device)))

    @staticmethod
    def has_streams() -> bool:
        """Whether the library runs operators asynchronously on its own streams (diopi_stream_*)."""
        return bool(_runtime().has_streams())

    @staticmethod
    def default_generator(index: int) -> torch.Generator:
        return _runtime().default_generator(int(index))

    @staticmethod
    def manual_seed(seed: int) -> None:
        NativeDeviceModule.default_generator(_runtime().current_device()).manual_seed(int(seed))

    @staticmethod
    def manual_seed_all(seed: int) -> None:
        for i in range(NativeDeviceModule.device_count()):
            NativeDeviceModule.default_generator(i).manual_seed(int(seed))

    @staticmethod
    def get_rng_state(device: Any = None) -> torch.Tensor:
        return NativeDeviceModule.default_generator(_index(device)).get_state()

    @staticmethod
    def set_rng_state(state: torch.Tensor, device: Any = None) -> None:
        NativeDeviceModule.default_generator(_index(device)).set_state(state)

    # Memory: the extension's caching allocator, whose statistics torch.accelerator reads.
    @staticmethod
    def memory_stats(device: Any = None) -> dict[str, Any]:
        return dict(torch.accelerator.memory_stats(_index(device)))

    @staticmethod
    def memory_allocated(device: Any = None) -> int:
        return torch.accelerator.memory_allocated(_index(device))

    @staticmethod
    def max_memory_allocated(device: Any = None) -> int:
        return torch.accelerator.max_memory_allocated(_index(device))

    @staticmethod
    def memory_reserved(device: Any = None) -> int:
        return torch.accelerator.memory_reserved(_index(device))

    @staticmethod
    def max_memory_reserved(device: Any = None) -> int:
        return torch.accelerator.max_memory_reserved(_index(device))

    @staticmethod
    def reset_peak_memory_stats(device: Any = None) -> None:
        torch.accelerator.reset_peak_memory_stats(_index(device))

    @staticmethod
    def empty_cache() -> None:
        _runtime().empty_cache()

    @staticmethod
    def set_caching(on: bool) -> None:
        """Keep freed blocks for reuse (the default), or give them back to the library at once (this empties
        the cache)."""
        _runtime().set_caching(bool(on))



def _index(device: Any) -> int:
    if device is None:
        return int(_runtime().current_device())
    if isinstance(device, int):
        return device
    index = torch.device(device).index
    return int(_runtime().current_device()) if index is None else int(index)


_router: NativeRouter | None = None


def enable_native(lib: DiopiLibrary) -> NativeRouter:
    """Attach ``lib`` to PrivateUse1 (renamed ``diopi``); once per process."""
    global _router
    if _router is not None:
        if _router.library.path != lib.path:
            raise NativeDeviceError(f"the native diopi device already serves {_router.library.path}; one library "
                                    f"per process")
        return _router
    memory = DeviceMemory.of(lib)
    if memory is None:
        raise NativeDeviceError(
            f"{lib.path} does not export {', '.join(DeviceMemory.missing(lib))}: the native diopi device needs "
            f"the device-memory functions of diopi/diopirt.h (use the host-memory device instead: "
            f"DIOPI_DEVICE_BACKEND=python)")
    current = torch._C._get_privateuse1_backend_name()
    if current not in ("privateuseone", DEVICE_TYPE):
        raise NativeDeviceError(f"PrivateUse1 is already the {current!r} device in this process (a vendor plug-in "
                                f"claimed it); the diopi device needs it")
    if hasattr(torch, DEVICE_TYPE) and not isinstance(getattr(torch, DEVICE_TYPE), NativeDeviceModule):
        raise NativeDeviceError("the host-memory diopi device is already enabled in this process")
    runtime = _runtime()
    addresses = memory.addresses()
    addresses["diopi_last_error"] = _address(lib._dll.diopi_last_error)
    runtime.attach(addresses)
    if current != DEVICE_TYPE:
        torch.utils.rename_privateuse1_backend(DEVICE_TYPE)
    torch._register_device_module(DEVICE_TYPE, NativeDeviceModule())
    torch.utils.generate_methods_for_privateuse1_backend(for_storage=True)
    router = NativeRouter(lib, runtime)
    _router = router
    from diopi_bindings import _C_diopi

    # Every operator without a kernel of its own runs in C++ (csrc_diopi/cpu_fallback.cpp): views as metadata,
    # the rest on the CPU. Python only says once per operator that it fell back.
    _C_diopi.register_fallback(_log_first_fallback)
    _library_ops.append(_register_library_ops(router))
    _registrations.append(_register_composites(lib, router))
    return router


def _log_first_fallback(name: str) -> None:
    vendor = _router.library.vendor if _router is not None else "the library"
    logger.info("diopi: %s runs on the CPU (%s does not implement it)", name, vendor)


def _log_declined(name: str, reason: str) -> None:
    """The first call of ``name`` that the library's route sent to the CPU (reason empty: the library lacks it)."""
    vendor = _router.library.vendor if _router is not None else "the library"
    logger.info("diopi: %s runs on the CPU (%s)", name, reason or f"{vendor} does not implement it")


class _Routes:
    """C++ kernels of the own-ABI library's overloads (csrc_diopi/own_router.cpp), registered from the router's plans
    and unregistered by ``_destroy`` (the interface of torch.library.Library the callers use)."""

    def __init__(self, router: NativeRouter, funcs: list[Any]) -> None:
        from diopi_bindings import _C_diopi

        plans = [router.route_plan(func) for func in funcs]
        self._handle = _C_diopi.register_own_routes(plans, _address(router.library._dll.diopi_last_error),
                                                    _log_declined)

    def _destroy(self) -> None:
        from diopi_bindings import _C_diopi

        _C_diopi.drop_own_routes(self._handle)


# Kernels of the (own-ABI) library's operators, registered per ATen overload (_register_library_ops).
_library_ops: list[_Routes] = []


def _reaches_the_fallback(name: str) -> bool:
    """Whether PrivateUse1 has no kernel of its own for ``name`` (no direct one, no composite)."""
    return not any(torch._C._dispatch_has_kernel_for_dispatch_key(name, key) for key in _OWN_KERNEL_KEYS)


_OWN_KERNEL_KEYS = ("PrivateUse1", "CompositeImplicitAutograd", "CompositeExplicitAutograd",
                    "CompositeExplicitAutogradNonFunctional")


def _register_library_ops(router: NativeRouter, skip: frozenset[str] = frozenset()) -> _Routes:
    """The ATen overloads the library serves that would reach the device's fallback: each gets its C++ route as
    its PrivateUse1 kernel (set-up, once; every other overload stays with the C++ fallback). ``skip``: overloads
    routed in C++ to a DeepLink DIOPI library instead."""
    funcs = []
    for name in torch._C._dispatch_get_all_op_names():
        if (not name.startswith("aten::") or name in skip or name in _MEMORY_OPS
                or not _reaches_the_fallback(name)):
            continue
        func = _overload(name)
        if func is not None and router.serves(func):
            funcs.append(func)
    return _Routes(router, funcs)


def _overload(name: str) -> Any:
    packet, _, overload = name.removeprefix("aten::").partition(".")
    try:
        return getattr(getattr(torch.ops.aten, packet), overload or "default")
    except (AttributeError, RuntimeError):
        return None


def routed_in_cpp(routed: list[str]) -> None:
    """After a DeepLink DIOPI library took ``routed`` (ATen overloads): the own-ABI library's kernels are
    registered again without them. The caller dropped them first (drop_library_ops), so C++ registers no kernel
    over a Python one."""
    if _router is not None:
        _library_ops.append(_register_library_ops(_router, frozenset(routed)))


def drop_library_ops() -> None:
    while _library_ops:
        _library_ops.pop()._destroy()


# Served by the extension's copies, never by the library's operators of the same name.
_MEMORY_OPS = frozenset({"aten::_to_copy", "aten::copy_", "aten::clone"})


def _register_composites(lib: DiopiLibrary, router: NativeRouter, skip: frozenset[str] = frozenset()) -> _Routes:
    """Schema operators whose ATen kernel is a composite for every backend (embedding is index_select,
    _safe_softmax a masked softmax) never reach a backend's fallback: register their C++ routes on
    PrivateUse1 itself, so the library's kernel serves them (except those in ``skip``)."""
    funcs = []
    for name in BY_NAME:
        if (not name.startswith("aten::") or name in _MEMORY_OPS or not lib.implements(name) or name in skip
                or torch._C._dispatch_has_kernel_for_dispatch_key(name, "CPU")
                or not torch._C._dispatch_has_kernel_for_dispatch_key(name, "CompositeExplicitAutograd")):
            continue
        packet, _, overload = name.removeprefix("aten::").partition(".")
        funcs.append(getattr(getattr(torch.ops.aten, packet), overload or "default"))
    return _Routes(router, funcs)


_registrations: list[_Routes] = []


def leave_composites_to_aten(routed_in_cpp: list[str]) -> list[str]:
    """After a DeepLink DIOPI library is attached: the schema composites whose ATen composite reaches an
    overload now routed in C++ (arange.start_step is empty + arange.start_out) run ATen's composite instead of
    the own-ABI library's route. Returns them."""
    if _router is None or not _registrations:
        return []
    out_forms = {name.split(".")[0] for name in routed_in_cpp if _is_out_form(name)}
    composites = {name for name in BY_NAME if name.startswith("aten::")
                  and torch._C._dispatch_has_kernel_for_dispatch_key(name, "CompositeExplicitAutograd")
                  and not torch._C._dispatch_has_kernel_for_dispatch_key(name, "CPU")}
    # (and those routed to the DIOPI library themselves: registering the own route again would take them back)
    skip = frozenset(name for name in composites if name.split(".")[0] in out_forms or name in routed_in_cpp)
    if skip:
        _registrations.pop()._destroy()
        _registrations.append(_register_composites(_router.library, _router, skip))
    return sorted(skip)


def _is_out_form(name: str) -> bool:
    packet, _, overload = name.removeprefix("aten::").partition(".")
    schema = getattr(getattr(torch.ops.aten, packet), overload or "default")._schema
    return any(a.is_out for a in schema.arguments)


def _address(fn: Any) -> int:
    import ctypes

    return int(ctypes.cast(fn, ctypes.c_void_p).value or 0)


def native_router() -> NativeRouter | None:
    return _router
