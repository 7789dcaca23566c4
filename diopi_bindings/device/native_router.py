"""The router of the native device (``_C_device``): the same resolution and argument binding as the
host-memory stand-in (router.py), on tensors whose memory the library allocated.

The C++ extension serves allocation, views, ``resize_``/``set_`` and copies; the ATen overloads the
library implements (``serves``) get this router as their PrivateUse1 kernel, registered once at set-up
(native.py); every other operator reaches the boxed fallback in C++ (csrc_diopi/cpu_fallback.cpp). An
operator of the library runs there on device memory (outputs allocated on the device from the meta
kernel). When the library declines a call (a dtype it lacks, arguments its ABI cannot carry), the call
is logged once per operator, counted, and handed to the same C++ fallback, which runs it on the CPU.
"""
from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from diopi_bindings.device.router import (
    _MASKED_SELECT,
    _METADATA_OPS,
    DEVICE_TYPE,
    Router,
    _is_view,
)
from diopi_bindings.library import DiopiLibrary
from diopi_bindings.schema import OpSchema


_ZERO, _FILL = torch.ops.aten.zero_.default, torch.ops.aten.fill_.Scalar


def _one_device(devices: set[torch.device]) -> None:
    """Operands on two devices are an error, as on any torch device (the library would read one device's
    memory as the other's)."""
    if len(devices) > 1:
        names = sorted(str(d) for d in devices)
        raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                           f"{names[0]} and {names[1]}!")


def is_native_tensor(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type == DEVICE_TYPE


class NativeRouter(Router):
    def __init__(self, library: DiopiLibrary, runtime: Any) -> None:
        super().__init__(library, lambda t: t, is_native_tensor)
        self.runtime = runtime  # diopi_bindings._C_device

    def dispatch(self, func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
        if func is _ZERO and self.resolve(_FILL)[0] is not None:  # zero_ is fill_ with 0
            return self.route(_FILL, (args[0], 0), {})
        return self.route(func, args, kwargs)

    # --- the library on device memory ---------------------------------------------------------
    def _device_of(self, bound: dict[str, Any]) -> torch.device:
        devices = {leaf.device for leaf in tree_flatten(list(bound.values()))[0] if is_native_tensor(leaf)}
        _one_device(devices)
        return next(iter(devices)) if devices else torch.device(DEVICE_TYPE, self.runtime.current_device())

    def _operand(self, value: Any, device: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.device != device:  # a CPU scalar tensor, say
            self.copies["operand to device"] += 1
            return value.to(device)
        return value

    def serves(self, func: torch._ops.OpOverload) -> bool:
        """Whether ``func`` is the library's to run (its kernel is this router); views and every operator the
        library lacks are the C++ fallback's."""
        if _is_view(func) or func._schema.name in _METADATA_OPS:
            return False
        if func is _ZERO:
            return self.resolve(_FILL)[0] is not None
        if func in _MASKED_SELECT:
            return all(self.resolve(f)[0] is not None for f in (torch.ops.aten.nonzero.default,
                                                                torch.ops.aten.index.Tensor))
        return self.resolve(func)[0] is not None

    def copy_counts(self) -> Counter[str]:
        """Every tensor copy of the device by direction (counted in C++: .to(), .cpu(), .item(), the CPU
        fallback's and the router's own), and by reason: the C++ fallback's and the router's own."""
        from diopi_bindings import _C_diopi

        out = Counter({k: int(v) for k, v in self.runtime.copy_counts().items() if v})
        out.update({k: int(v) for k, v in _C_diopi.fallback_copies().items() if v})
        out.update(self.copies)
        return out

    def fallback_counts(self) -> Counter[str]:
        """Calls run on the CPU per ATen overload: the C++ fallback's (operators the library lacks) and the
        router's own (an operator of the library that declined these arguments)."""
        from diopi_bindings import _C_diopi

        out = Counter({k: int(v) for k, v in _C_diopi.fallback_counts().items()})
        out.update(self.fallbacks)
        return out

    def _library_device(self, device: Any) -> torch.device:
        return device

    def _new_output(self, meta: torch.Tensor, device: Any) -> torch.Tensor:
        return torch.empty_strided(meta.shape, meta.stride(), dtype=meta.dtype, device=device)

    def _run(self, op: OpSchema, abi_args: list, device: Any) -> tuple[torch.Tensor, ...] | None:
        # This ABI's operators run synchronously (no stream): work queued on the device's current
        # stream by DeepLink DIOPI operators finishes first (a no-op without library streams).
        self.runtime.synchronize_current_stream(device.index)
        previous = self.runtime.current_device()
        if device.index == previous:
            return self.library.call(op, *abi_args)
        self.runtime.set_device(device.index)  # the library runs on the tensors' device
        try:
            return self.library.call(op, *abi_args)
        finally:
            self.runtime.set_device(previous)

    # --- a declined call: the device's fallback --------------------------------------------
    def _on_host(self, func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
        """The call on the CPU through the device's C++ fallback (copies, generators, written arguments), as
        an operator the library lacks runs; the router has counted and logged it."""
        from diopi_bindings import _C_diopi

        return _C_diopi.run_on_cpu(func._schema.name, func._schema.overload_name, args, kwargs)
