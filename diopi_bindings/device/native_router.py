"""The router of the native device (``_C_device``): the same resolution and argument binding as the
host-memory stand-in (router.py), on tensors whose memory the library allocated.

The C++ extension serves allocation, views, ``resize_``/``set_`` and copies; the ATen overloads the
library implements (``serves``) get this router as their PrivateUse1 kernel, registered once at set-up
(native.py); every other operator reaches the boxed fallback in C++ (csrc_diopi/cpu_fallback.cpp). An
operator of the library runs there on device memory (outputs allocated on the device from the meta
kernel). When the library declines a call (a dtype it lacks, arguments its ABI cannot carry), the call
runs on the CPU here: inputs copied to the host, the operator run, written arguments copied back
(resized if the operator resized them) and results moved to the device; logged once per operator.
Random operators run on the CPU with the state of the device's generator, which they advance.
"""
from __future__ import annotations

import threading
from collections import Counter
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_flatten, tree_map

from diopi_bindings.device.router import (
    _CPU,
    _MASKED_SELECT,
    _METADATA_OPS,
    DEVICE_TYPE,
    Router,
    _bind,
    _is_view,
    _to_meta,
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


# A random operator runs on the CPU with a copy of a device generator's state and writes the advanced state
# back: one copy-run-write back must not interleave with another thread's on the same generator (two threads
# would draw the same numbers). Random operators run on the CPU anyway, so one lock for all costs nothing.
_RANDOM = threading.RLock()


def _native_dropout(generator: torch.Generator, input: torch.Tensor, p: float,
                    train: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """ATen's CPU native_dropout with the generator explicit: a Bernoulli(1 - p) mask in the input's
    dtype (the same draws as the CPU kernel for a seed), the input scaled by 1/(1 - p) where kept."""
    if input.numel() == 0:
        return input, torch.empty_like(input)
    if train is None or train:
        keep = 1.0 - p
        mask = torch.empty_like(input, memory_format=torch.contiguous_format).bernoulli_(keep, generator=generator)
        output = input.mul(mask).mul_(0.0 if keep == 0 else 1.0 / keep)
        return output, mask.to(torch.bool)
    return input.clone(), torch.ones_like(input, dtype=torch.bool)


def _flash_attention_for_cpu(generator: torch.Generator, *args: Any, **kwargs: Any) -> Any:
    """The CPU's flash attention refuses dropout > 0 (torch's own error), so it never draws: run it as is."""
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default(*args, **kwargs)


# Random operators without a generator argument draw from the CPU's default generator. Their equivalents
# with the generator explicit leave the CPU's generator alone, so a thread drawing from it meanwhile is safe.
# These are all the ATen ones a backend's fallback can receive that have a CPU kernel (the others decompose
# to operators with a generator argument, or have no CPU kernel); test_diopi_native_device checks the list.
_WITH_GENERATOR: dict[Any, Callable[..., Any]] = {
    torch.ops.aten.native_dropout.default: _native_dropout,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default: _flash_attention_for_cpu,
}


def _cpu_part(state: torch.Tensor) -> torch.Tensor:
    """The CPU algorithm's part of a device generator's state (the rest is the DIOPI counter, hooks.cpp)."""
    return state[:_CPU_STATE_BYTES]


_CPU_STATE_BYTES = torch.Generator().get_state().numel()


def _with_device_stream(func: torch._ops.OpOverload, args: tuple, kwargs: dict,
                        device_generator: torch.Generator) -> Any:
    """``func`` on the CPU drawing from ``device_generator``'s stream, which then advances."""
    explicit = _WITH_GENERATOR.get(func)
    with _RANDOM:
        cpu = torch.Generator()
        cpu.set_state(_cpu_part(device_generator.get_state()))
        if explicit is not None:
            out = explicit(cpu, *args, **kwargs)
            device_generator.set_state(cpu.get_state())
            return out
        # Any other (an operator of another library's namespace): lend the CPU's default generator the
        # device's state for the call. A thread drawing from the CPU's default generator during it is not
        # protected (torch has no per-thread default).
        default = torch.default_generator
        saved = default.get_state()
        default.set_state(cpu.get_state())
        try:
            out = func(*args, **kwargs)
            device_generator.set_state(default.get_state())
        finally:
            default.set_state(saved)
        return out


def _is_random(func: torch._ops.OpOverload) -> bool:
    return (torch.Tag.nondeterministic_seeded in func.tags
            or any(a.name == "generator" for a in func._schema.arguments))


def is_native_tensor(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type == DEVICE_TYPE


class NativeRouter(Router):
    def __init__(self, library: DiopiLibrary, runtime: Any) -> None:
        super().__init__(library, lambda t: t, is_native_tensor)
        self.runtime = runtime  # diopi_bindings._C_device

    def dispatch(self, func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
        if _is_view(func) or func._schema.name in _METADATA_OPS:
            return self._view(func, args, kwargs)
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

    # --- views: metadata only ---------------------------------------------------------------
    def _view(self, func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
        base = args[0]
        meta = func(*tree_map(_to_meta, args), **tree_map(_to_meta, kwargs))

        def alias(m: Any) -> Any:
            if not isinstance(m, torch.Tensor):
                return m
            if m.dtype == base.dtype:
                return torch.as_strided(base, m.shape, m.stride(), base.storage_offset() + m.storage_offset())
            # The same bytes in another dtype (view_as_real, view(dtype)): as_strided would keep the base's
            # dtype. The meta view's offset counts its own elements from the base's first byte.
            offset = base.storage_offset() * base.element_size() // m.element_size() + m.storage_offset()
            view = torch.empty(0, dtype=m.dtype, device=base.device)
            return view.set_(base.untyped_storage(), offset, m.shape, m.stride())

        return tree_map(alias, meta)

    # --- the CPU fallback -------------------------------------------------------------------
    def _on_host(self, func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
        if _is_random(func):  # the generator's state is copied, used and written back as one step
            with _RANDOM:
                return self._copied_to_host(func, args, kwargs)
        return self._copied_to_host(func, args, kwargs)

    def _copied_to_host(self, func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
        on_cpu: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id(cpu copy) -> (device tensor, copy)
        device: list[torch.device] = []
        generators: list[tuple[torch.Generator, torch.Generator]] = []

        def to_cpu(x: Any) -> Any:
            if is_native_tensor(x):
                device.append(x.device)
                self.copies["fallback to host"] += 1
                copy = x.cpu()
                on_cpu[id(copy)] = (x, copy)
                return copy
            if isinstance(x, torch.device) and x.type == DEVICE_TYPE:
                device.append(x)
                return _CPU
            if isinstance(x, torch.Generator) and x.device.type == DEVICE_TYPE:
                return self._cpu_generator(x, generators)
            return x

        cpu_args, cpu_kwargs = tree_map(to_cpu, args), tree_map(to_cpu, kwargs)
        _one_device({d for d in device if d.index is not None})
        target = device[0] if device else torch.device(DEVICE_TYPE, self.runtime.current_device())
        names = [a.name for a in func._schema.arguments]
        if "generator" in names and _bind(func, cpu_args, cpu_kwargs).get("generator") is None:
            # No generator given: the device's default one, not the CPU's.
            index = target.index if target.index is not None else self.runtime.current_device()
            generator = self._cpu_generator(self.runtime.default_generator(index), generators)
            position = names.index("generator")
            if position < len(cpu_args):
                cpu_args = (*cpu_args[:position], generator, *cpu_args[position + 1:])
            else:
                cpu_kwargs["generator"] = generator
        if "generator" not in names and torch.Tag.nondeterministic_seeded in func.tags:
            # A random operator without a generator argument (native_dropout) draws from the CPU's default
            # generator: lend it the device generator's state for the call, and give the CPU its own back.
            index = target.index if target.index is not None else self.runtime.current_device()
            out = _with_device_stream(func, cpu_args, cpu_kwargs, self.runtime.default_generator(index))
        else:
            out = func(*cpu_args, **cpu_kwargs)
        for device_generator, cpu_generator in generators:  # the device generator advances
            device_generator.set_state(cpu_generator.get_state())
        written = {a.name for a in func._schema.arguments if a.alias_info is not None and a.alias_info.is_write}
        for name, value in _bind(func, cpu_args, cpu_kwargs).items():
            if name in written and isinstance(value, torch.Tensor) and id(value) in on_cpu:
                original, copy = on_cpu[id(value)]
                if original.shape != copy.shape:  # an out= the operator resized
                    original.resize_(copy.shape)
                self.copies["fallback to device"] += 1
                original.copy_(copy)

        def to_device(x: Any) -> Any:
            if not isinstance(x, torch.Tensor):
                return x
            hit = on_cpu.get(id(x))
            if hit is not None:  # an in-place or out= result: the caller's own device tensor
                return hit[0]
            self.copies["fallback to device"] += 1
            return x.to(target)

        return tree_map(to_device, out)

    @staticmethod
    def _cpu_generator(device_generator: torch.Generator,
                       generators: list[tuple[torch.Generator, torch.Generator]]) -> torch.Generator:
        cpu = torch.Generator()
        cpu.set_state(_cpu_part(device_generator.get_state()))
        generators.append((device_generator, cpu))
        return cpu

