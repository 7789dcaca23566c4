"""Running an op again elsewhere: on copies of its inputs, on another device and/or in float64."""
from __future__ import annotations

import torch

# Ops whose outputs are not a function of their inputs: random, or uninitialised memory.
UNINITIALISED = ("aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty",
                  "aten::new_empty_strided", "aten::empty_permuted", "aten::resize_", "aten::set_")


def skip_reason(func) -> str | None:
    """Why an op cannot be checked by re-running it, or None."""
    if torch.Tag.nondeterministic_seeded in func.tags:
        return "random op"
    if func._schema.name in UNINITIALISED:
        return "uninitialised output"
    return None


def without_randomness(func, args, kwargs) -> bool:
    """A seeded-random op called with a zero ``dropout_p`` (the fused attention kernels without
    dropout) is a deterministic function of its inputs and can be replayed."""
    for i, a in enumerate(func._schema.arguments):
        if a.name == "dropout_p":
            value = kwargs.get(a.name, args[i] if i < len(args) else a.default_value)
            return value == 0
    return False


def _convert(t: torch.Tensor, device: str | torch.device, dtype: torch.dtype | None) -> torch.Tensor:
    if dtype is not None and t.dtype.is_floating_point:
        return t.detach().to(device=device, dtype=dtype, copy=True)
    if dtype is not None and t.is_complex():
        return t.detach().to(device=device, dtype=torch.complex128, copy=True)
    return t.detach().to(device=device, copy=True)


def _map_one(fn, x):
    # An ATen argument is a tensor, a list of tensors (or of optional tensors) or a plain value:
    # one level of lists suffices, and is cheaper than a general tree walk for every op.
    if isinstance(x, (list, tuple)):
        return type(x)(_map_one(fn, v) for v in x) if any(isinstance(v, (torch.Tensor, list, tuple)) for v in x) else x
    return fn(x)


def _map_args(fn, args):
    return tuple(_map_one(fn, a) for a in args)


def convert_inputs(args, kwargs, device: str | torch.device = "cpu", dtype: torch.dtype | None = torch.float64):
    """Copies of the inputs on ``device``; floating ones in ``dtype`` (None keeps their dtype). A
    ``device=`` argument of a factory op is redirected too."""
    conv = lambda x: _convert(x, device, dtype) if isinstance(x, torch.Tensor) else x  # noqa: E731
    args = _map_args(conv, args)
    kwargs = {k: _map_one(conv, v) for k, v in kwargs.items()}
    if "device" in kwargs and kwargs["device"] is not None:
        kwargs["device"] = torch.device(device)
    return args, kwargs


def run_reference(func, args, kwargs, device: str | torch.device = "cpu", dtype: torch.dtype | None = torch.float64):
    """``func`` on converted copies of the inputs; returns its outputs."""
    rargs, rkwargs = convert_inputs(args, kwargs, device, dtype)
    return func(*rargs, **rkwargs)
