"""The patch strategy (default): wrap only the torch entry points that take a device.

Those are found from torch's own operator schemas (every ``aten`` op with a ``device`` argument
that torch exposes as ``torch.<name>``) plus the few Python-level ones. Every other torch call runs
untouched, so the shim costs nothing on the operations of a training step. Calls bound before
``import ditorch`` (``from torch import zeros``) are not seen; the mode strategy sees those.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import torch

from ditorch.patchset import PatchSet, remember_device_constructors
from ditorch.translate import DEVICE_CLASSES, SAME, DeviceTranslator

_EXTRA_TORCH = ("asarray", "as_tensor", "tensor")
_TENSOR_KW = ("new_empty", "new_empty_strided", "new_full", "new_ones", "new_tensor", "new_zeros")


@functools.cache
def device_taking_torch_functions() -> tuple[str, ...]:
    """Names ``torch.<name>`` of functions (not classes) that accept a ``device`` argument."""
    names = {
        schema.name.split("::", 1)[1]
        for schema in torch._C._jit_get_all_schemas()
        if schema.name.startswith("aten::") and any(arg.name == "device" for arg in schema.arguments)
    }
    names.update(_EXTRA_TORCH)
    return tuple(sorted(n for n in names if not n.startswith("_") and callable(getattr(torch, n, None))
                        and not isinstance(getattr(torch, n), type)))


def _keyword(fn: Callable, tr: DeviceTranslator) -> Callable:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        dev = kwargs.get("device")
        if dev is not None and dev.__class__ in DEVICE_CLASSES:
            new = tr.lookup(dev)
            if new is not SAME:
                kwargs["device"] = new
        return fn(*args, **kwargs)

    return wrapper


def _positional(fn: Callable, tr: DeviceTranslator, pos: int) -> Callable:
    """For ``Tensor.to`` (device is args[1] after self) and ``_parse_to`` (args[0])."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if len(args) > pos and args[pos].__class__ in DEVICE_CLASSES:
            new = tr.lookup(args[pos])
            if new is not SAME:
                args = (*args[:pos], new, *args[pos + 1 :])
        dev = kwargs.get("device")
        if dev is not None and dev.__class__ in DEVICE_CLASSES:
            new = tr.lookup(dev)
            if new is not SAME:
                kwargs["device"] = new
        return fn(*args, **kwargs)

    return wrapper


def _cuda(to: Callable, tr: DeviceTranslator) -> Callable:
    def cuda(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return tr.cuda_call(to, self, args, kwargs)

    functools.update_wrapper(cuda, torch.Tensor.cuda)
    return cuda


def _pinning(fn: Callable, tr: DeviceTranslator, on_cpu: Callable[[torch.Tensor], Any]) -> Callable:
    """``Tensor.pin_memory(device)`` / ``Tensor.is_pinned(device)``: the device argument names the
    accelerator the memory is pinned for. On the CPU vendor the "device" is the host itself, whose
    memory needs no pinning (torch refuses the CPU there: "not an accelerator"): ``on_cpu`` answers."""

    @functools.wraps(fn)
    def wrapper(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        dev = args[0] if args else kwargs.get("device")
        if dev is not None and dev.__class__ in DEVICE_CLASSES:
            new = tr.lookup(dev)
            if new is not SAME:
                if torch.device(new).type == "cpu":
                    return on_cpu(self)
                args, kwargs = ((new, *args[1:]), kwargs) if args else (args, {**kwargs, "device": new})
        return fn(self, *args, **kwargs)

    return wrapper


PIN_ON_CPU: dict[str, Callable[[torch.Tensor], Any]] = {"pin_memory": lambda t: t, "is_pinned": lambda t: False}


def install_device_patches(patches: PatchSet, tr: DeviceTranslator) -> None:
    remember_device_constructors()
    for name in device_taking_torch_functions():
        patches.set(torch, name, _keyword(getattr(torch, name), tr))
    for name in _TENSOR_KW:
        patches.set(torch.Tensor, name, _keyword(getattr(torch.Tensor, name), tr))
    patches.set(torch.Tensor, "to", _positional(torch.Tensor.to, tr, 1))
    for name, on_cpu in PIN_ON_CPU.items():
        patches.set(torch.Tensor, name, _pinning(getattr(torch.Tensor, name), tr, on_cpu))
    patches.set(torch._C._nn, "_parse_to", _positional(torch._C._nn._parse_to, tr, 0))


def install_cuda_patches(patches: PatchSet, tr: DeviceTranslator) -> None:
    patches.set(torch.Tensor, "cuda", _cuda(torch._C.TensorBase.to, tr))
