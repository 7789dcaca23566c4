"""The unified device name in torch APIs that take a device but are not tensor factories:
``torch.load(map_location=...)``, ``torch.set_default_device``, ``torch.Generator(device=...)``,
``torch.get_device_module``, ``torch.autocast`` / ``torch.amp.autocast``.

None of them is a torch function (no torch-function mode sees them), so both strategies patch them.
``torch.Generator`` is a class of C++: it is replaced by a subclass that translates the device and
answers ``isinstance`` for the original's instances too. ``torch.autocast`` keeps its class (torch.compile
recognises it by identity): its ``__init__`` translates.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_map

from ditorch.hf_device_map import install_hf_patches
from ditorch.patchset import PatchSet
from ditorch.translate import DEVICE_CLASSES, SAME, DeviceTranslator


def _translated(tr: DeviceTranslator, dev: Any) -> Any:
    if dev is not None and dev.__class__ in DEVICE_CLASSES:
        new = tr.lookup(dev)
        if new is not SAME:
            return new
    return dev


def _map_location(tr: DeviceTranslator, location: Any) -> Any:
    """``map_location`` may be a device, a {source: target} dict or a callable (left alone)."""
    if isinstance(location, dict):
        return {k: _translated(tr, v) for k, v in location.items()}
    return _translated(tr, location)


def _storage_less(location: Any) -> torch.device | None:
    """The target device, if its tensors have no torch storage of their own (the diopi device's tensors
    live in host tensors): torch.load cannot restore storages there, so they are restored on the CPU and
    their tensors moved."""
    if not isinstance(location, (str, torch.device)):
        return None
    device = torch.device(location)
    module = getattr(torch, device.type, None)
    return device if getattr(module, "tensors_without_storage", False) else None


def _via_host(location: Any) -> tuple[Callable, dict[int, torch.device]] | None:
    """For a ``map_location`` (a device or a {source: target} dict) sending some storages to a storage-less
    device: a ``map_location`` callable restoring those on the CPU, and the record it fills (the restored
    storage's data pointer -> the device its tensors move to). None when no target is storage-less."""
    if isinstance(location, dict):
        targets = dict(location)
    elif isinstance(location, (str, torch.device)):
        targets = None
    else:
        return None  # None (the saved locations) or the caller's own callable
    wanted = [location] if targets is None else list(targets.values())
    if not any(_storage_less(t) is not None for t in wanted):
        return None
    moved: dict[int, torch.device] = {}

    def restore(storage: Any, saved_at: str) -> Any:
        target = location if targets is None else targets.get(saved_at, saved_at)
        device = _storage_less(target)
        if device is None:
            return torch.serialization.default_restore_location(storage, str(target))
        moved[storage.data_ptr()] = device
        return storage  # stays on the CPU until its tensors move

    return restore, moved


def _load(load: Callable, tr: DeviceTranslator) -> Callable:
    @functools.wraps(load)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if len(args) > 1:
            args = (args[0], _map_location(tr, args[1]), *args[2:])
        if "map_location" in kwargs:
            kwargs["map_location"] = _map_location(tr, kwargs["map_location"])
        plan = _via_host(args[1] if len(args) > 1 else kwargs.get("map_location"))
        if plan is None:
            return load(*args, **kwargs)
        restore, moved = plan
        if len(args) > 1:
            args = (args[0], restore, *args[2:])
        else:
            kwargs["map_location"] = restore
        loaded = load(*args, **kwargs)

        def move(t: Any) -> Any:
            if not isinstance(t, torch.Tensor) or t.device.type != "cpu":
                return t
            target = moved.get(t.untyped_storage().data_ptr())
            return t if target is None else t.to(target)

        return tree_map(move, loaded)

    return wrapper


def _first_arg(fn: Callable, tr: DeviceTranslator, name: str) -> Callable:
    """``fn(device, ...)`` with the device positional or as keyword ``name``."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if args:
            args = (_translated(tr, args[0]), *args[1:])
        if name in kwargs:
            kwargs[name] = _translated(tr, kwargs[name])
        return fn(*args, **kwargs)

    return wrapper


def _generator_class(original: type, tr: DeviceTranslator) -> type:
    class GeneratorMeta(type(original)):
        def __instancecheck__(cls, obj: Any) -> bool:
            return isinstance(obj, original)

        def __subclasscheck__(cls, sub: type) -> bool:
            return issubclass(sub, original)

        def __call__(cls, device: Any = "cpu") -> Any:
            target = _translated(tr, device)
            try:
                return original(target)
            except RuntimeError as exc:
                if target is device:
                    raise
                raise RuntimeError(f"torch.Generator(device={device!r}): the {torch.device(target).type!r} device "
                                   f"has no generator of its own ({exc}); create a CPU torch.Generator() and pass "
                                   f"it to the factory") from None

    return GeneratorMeta("Generator", (original,), {"__module__": "torch", "__doc__": original.__doc__})


def _autocast_init(init: Callable, tr: DeviceTranslator, autocast_type: Callable[[], str]) -> Callable:
    """``device_type="device"`` means the vendor's autocast device type (``Adapter.autocast_device_type``).
    The class stays torch's own (torch.compile recognises it by identity); only its ``__init__`` changes."""

    @functools.wraps(init)
    def __init__(self: Any, device_type: str, *args: Any, **kwargs: Any) -> None:  # noqa: N807
        if _translated(tr, device_type) is not device_type:
            device_type = autocast_type()
        init(self, device_type, *args, **kwargs)

    return __init__


def _autocast_available(fn: Callable, tr: DeviceTranslator, autocast_type: Callable[[], str]) -> Callable:
    """``torch.amp.is_autocast_available("device")``: asks about the vendor's autocast device type."""

    @functools.wraps(fn)
    def is_autocast_available(device_type: str) -> bool:
        if _translated(tr, device_type) is not device_type:
            device_type = autocast_type()
        return fn(device_type)

    return is_autocast_available


def install_api_patches(patches: PatchSet, tr: DeviceTranslator, autocast_type: Callable[[], str]) -> None:
    patches.set(torch, "load", _load(torch.load, tr))
    patches.set(torch, "set_default_device", _first_arg(torch.set_default_device, tr, "device"))
    patches.set(torch, "get_device_module", _first_arg(torch.get_device_module, tr, "device"))
    patches.set(torch, "Generator", _generator_class(torch.Generator, tr))
    autocast = torch.amp.autocast_mode.autocast
    patches.set(autocast, "__init__", _autocast_init(autocast.__init__, tr, autocast_type))
    available = _autocast_available(torch.amp.autocast_mode.is_autocast_available, tr, autocast_type)
    patches.set(torch.amp.autocast_mode, "is_autocast_available", available)  # autocast's own check calls it here
    patches.set(torch.amp, "is_autocast_available", available)
    install_hf_patches(patches, lambda dev: _translated(tr, dev))
