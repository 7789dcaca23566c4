"""dtype_cast (run selected ops in a wider dtype) and fallback (run selected ops on the CPU).
Both hand back outputs in the dtype and on the device the op would have produced, and write
in-place results back into the original tensors. View ops run untouched, so views still alias
their base (a write through a view reaches the base, as in plain torch)."""
from __future__ import annotations

import logging
from collections import Counter

import torch
from torch.utils._pytree import tree_leaves, tree_map

from .opinfo import op_info
from .records import OpRecord
from .selection import Selector
from .tool import Tool

log = logging.getLogger("precision")


def _expected_outputs(func, args, kwargs):
    """Output dtypes and shapes from a meta-device run; None when the op has no meta kernel."""
    to_meta = lambda t: t.to("meta") if isinstance(t, torch.Tensor) else t  # noqa: E731
    try:
        margs, mkwargs = tree_map(to_meta, (args, kwargs))
        if "device" in mkwargs and mkwargs["device"] is not None:
            mkwargs["device"] = torch.device("meta")
        return func(*margs, **mkwargs)
    except Exception:  # data-dependent or meta-less ops: fall back to the inputs' dtype
        return None


def _write_back(func, args, kwargs, new_args, new_kwargs, out):
    """Copy results of in-place/out= ops into the caller's tensors; return outputs aliasing them."""
    swaps: list[tuple[torch.Tensor, torch.Tensor]] = []
    for i, arg in enumerate(func._schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        if arg.kwarg_only or i >= len(args):
            orig, new = kwargs.get(arg.name), new_kwargs.get(arg.name)
        else:
            orig, new = args[i], new_args[i]
        for o, n in zip(tree_leaves(orig), tree_leaves(new)):
            if isinstance(o, torch.Tensor) and isinstance(n, torch.Tensor) and o is not n:
                o.copy_(n)
                swaps.append((n, o))
    if not swaps:
        return out, False
    return tree_map(lambda t: next((o for n, o in swaps if t is n), t), out), True


def _run_converted(func, args, kwargs, convert, device_of_output):
    with Tool.quiet():
        expected = _expected_outputs(func, args, kwargs)
        new_args, new_kwargs = tree_map(convert, (args, dict(kwargs)))
    out = func(*new_args, **new_kwargs)  # the op itself stays visible to outer tools
    with Tool.quiet():
        return _restore(func, args, kwargs, new_args, new_kwargs, out, expected, device_of_output)


def _restore(func, args, kwargs, new_args, new_kwargs, out, expected, device_of_output):
    out, mutated = _write_back(func, args, kwargs, new_args, new_kwargs, out)
    exp_leaves = tree_leaves(expected) if expected is not None else None
    leaves, spec = torch.utils._pytree.tree_flatten(out)
    fixed = []
    for i, t in enumerate(leaves):
        if isinstance(t, torch.Tensor) and not (mutated and any(t is a for a in tree_leaves((args, kwargs)))):
            dtype = exp_leaves[i].dtype if exp_leaves is not None and i < len(exp_leaves) else None
            t = t.to(device=device_of_output, dtype=dtype or t.dtype)
        fixed.append(t)
    return torch.utils._pytree.tree_unflatten(fixed, spec)


def _first_device(args, kwargs) -> torch.device | None:
    for t in tree_leaves((args, kwargs)):
        if isinstance(t, torch.Tensor):
            return t.device
    dev = kwargs.get("device")
    return torch.device(dev) if dev is not None else None


class DtypeCast(Tool):
    """Floating inputs of a dtype in ``from_dtypes`` are cast to ``to`` for the selected ops."""

    name = "dtype_cast"

    def __init__(self, selector: Selector | None = None, *, to: torch.dtype = torch.float32,
                 from_dtypes: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16), **kwargs) -> None:
        super().__init__(selector, **kwargs)
        self.to, self.from_dtypes = to, tuple(from_dtypes)
        self.counts: Counter[str] = Counter()

    def handle(self, rec: OpRecord, func, args, kwargs):
        if op_info(func).is_view:  # a view must alias its base; it computes nothing to widen
            return func(*args, **kwargs)
        if not any(isinstance(t, torch.Tensor) and t.dtype in self.from_dtypes for t in tree_leaves((args, kwargs))):
            return func(*args, **kwargs)
        self.counts[rec.op] += 1
        convert = lambda t: t.to(self.to) if isinstance(t, torch.Tensor) and t.dtype in self.from_dtypes else t  # noqa: E731
        return _run_converted(func, args, kwargs, convert, _first_device(args, kwargs))


class Fallback(Tool):
    """The selected ops run on ``device`` (default CPU); outputs go back to the inputs' device."""

    name = "fallback"

    def __init__(self, selector: Selector | None = None, *, device: str = "cpu", **kwargs) -> None:
        super().__init__(selector, **kwargs)
        self.device = torch.device(device)
        self.counts: Counter[str] = Counter()

    def handle(self, rec: OpRecord, func, args, kwargs):
        home = _first_device(args, kwargs)
        if home is None or op_info(func).is_view:  # a view must alias its base, on its device
            return func(*args, **kwargs)
        self.counts[rec.op] += 1
        convert = lambda t: t.to(self.device) if isinstance(t, torch.Tensor) else t  # noqa: E731
        if "device" in kwargs and kwargs["device"] is not None:
            kwargs = {**kwargs, "device": self.device}
        return _run_converted(func, args, kwargs, convert, home)
