"""Routing ATen operators on the ``diopi`` device to a DIOPI library, generically from the schema.

For an operator the library implements, the ATen arguments are bound by name to the schema's ABI
arguments, the outputs are allocated from the operator's meta kernel (shapes, strides, dtypes), and
the library writes them. In-place variants (``add_``) run the functional operator and copy back.
An overload the schema does not list reaches its schema form when the arguments bind by name: a
``.Scalar`` overload the ``.Tensor`` operator (the number as a 0-dim tensor), an ``.out`` overload the
functional operator (the result copied into ``out``). View operators only change metadata: they run
on the host tensors behind the device tensors. Everything else falls back to the CPU, logged once
per operator.

This router serves the host-memory device (``__torch_dispatch__``, Python per operator by design). The native
device resolves its overloads with the same ``resolve`` (native_router.py) and runs them with the same rules in
C++ (csrc_diopi/own_router.cpp).
"""
from __future__ import annotations

import logging
import math
from collections import Counter
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_map

from diopi_bindings.abi import DtypeError
from diopi_bindings.library import DiopiLibrary, OperatorError
from diopi_bindings.schema import BY_NAME, GELU_APPROXIMATE, Arg, OpSchema

logger = logging.getLogger("diopi_bindings")

DEVICE_TYPE = "diopi"
_CPU = torch.device("cpu")


def aten_name(func: torch._ops.OpOverload) -> str:
    overload = func._overloadname
    return func._schema.name + ("" if overload == "default" else f".{overload}")


# Scalars ATen may leave as None: the value its CPU kernel would use, as (rule, the ATen tensor it derives from).
# The rules are those of the C++ routes too (csrc_diopi/own_router.h's OwnDefault).
SCALAR_DEFAULTS: dict[tuple[str, str], tuple[str, str]] = {
    ("aten::_fused_rms_norm", "eps"): ("dtype_eps", "input"),  # torch.finfo(input.dtype).eps
    ("aten::_scaled_dot_product_flash_attention_for_cpu", "scale"): ("rsqrt_last", "query"),  # 1 / sqrt(D)
    ("aten::_scaled_dot_product_flash_attention_for_cpu_backward", "scale"): ("rsqrt_last", "query"),
    ("aten::clamp", "min"): ("-inf", ""),  # clamp(x, min=None): no lower bound
    ("aten::clamp", "max"): ("inf", ""),
}


def _default(rule: str, source: Any) -> float:
    if rule == "dtype_eps":
        return torch.finfo(source.dtype).eps
    if rule == "rsqrt_last":
        return 1.0 / math.sqrt(source.shape[-1])
    return -math.inf if rule == "-inf" else math.inf


# How an ATen overload reaches a schema operator.
FUNCTIONAL, INPLACE, OUT = "functional", "inplace", "out"

# Operators that return a view but whose schema does not say so (reshape's helper): metadata only.
_METADATA_OPS = frozenset({"aten::_unsafe_view"})


# Operators that only allocate device memory (host memory here): no computation to route.
_ALLOCATIONS = frozenset({torch.ops.aten.empty_like.default, torch.ops.aten.new_empty.default,
                          torch.ops.aten.new_empty_strided.default})
# ABI arguments an ATen overload may lack, and what their absence means (an empty dim list reduces
# every dim; _scalar reads the absent value as None: [] for ints, False for bools).
_ABSENT_MEANS = frozenset({"dim", "keepdim"})
# Tensors made like another and filled: an allocation, then the library's fill_.
_FILLED_LIKE: dict[Any, Callable[[dict[str, Any]], Any]] = {
    torch.ops.aten.ones_like.default: lambda b: 1,
    torch.ops.aten.zeros_like.default: lambda b: 0,
    torch.ops.aten.full_like.default: lambda b: b["fill_value"],
}


class _Unservable(Exception):
    """These arguments need something the schema operator does not do (a resize of ``out``)."""


def _schema_form(func: torch._ops.OpOverload) -> tuple[OpSchema | None, str]:
    """The schema operator serving ``func`` and how: the same name, a ``.Scalar`` overload served by
    ``.Tensor``, an ``.out`` overload by the functional form, an in-place ``op_`` by ``op``."""
    name = aten_name(func)
    if name in BY_NAME:
        return BY_NAME[name], FUNCTIONAL
    base, _, overload = name.partition(".")
    mode = FUNCTIONAL
    if func._schema.name.endswith("_") and _writes_self(func):
        base, mode = base[:-1], INPLACE
    elif (overload == "out" or overload.endswith("_out")) and _out_name(func) is not None:
        overload, mode = overload.removesuffix("out").removesuffix("_"), OUT
    elif len(_out_names(func)) > 1 and "_" in overload:  # max.dim_max(max, max_values) is max.dim's out=
        overload, mode = overload.rsplit("_", 1)[0], OUT
    elif _out_names(func):
        # an out= overload named after its output (nll_loss_forward.output, gelu_backward.grad_input):
        # the functional operator's
        overload, mode = "", OUT
    if base.startswith("aten::_") and base.endswith("_impl"):  # _index_put_impl_ implements index_put_
        base = "aten::" + base.removeprefix("aten::_").removesuffix("_impl")
    names = [f"{base}.{overload}" if overload else base]
    if overload in ("Scalar", ""):
        names.append(f"{base}.Tensor")
    if mode == INPLACE and overload:  # pow_.Scalar is the in-place pow.Tensor_Scalar
        names.append(f"{base}.Tensor_{overload}")
    if mode in (FUNCTIONAL, OUT) and not overload:  # sum(x), mean(x), mean.out: the .dim forms
        names += [f"{base}.dim_IntList", f"{base}.dim"]
    if mode == OUT and overload:  # sum.IntList_out is the out= form of sum.dim_IntList
        names.append(f"{base}.dim_{overload}")
    if mode == OUT and overload == "start":  # arange.start_out is the out= form of arange.start_step
        names.append(f"{base}.start_step")
    aten_args = {a.name: a for a in func._schema.arguments}
    for candidate in dict.fromkeys(names):
        op = BY_NAME.get(candidate)
        if op is None:
            continue
        written = len(_out_names(func)) if mode == OUT else 1
        if mode != FUNCTIONAL and not (len(op.outputs) == written  # nonzero.out: out= takes what the library made
                                       and all(a.kind == "out" or (mode == OUT and a.is_allocated)
                                               for a in op.outputs)):
            continue
        if len(op.outputs) != len(func._schema.returns):  # max(x) is not max.dim's (values, indices)
            continue
        if all(_binds(a, aten_args.get(a.name)) for a in op.args if not a.is_output):
            return op, mode
    return None, mode


def _binds(arg: Arg, aten: Any) -> bool:
    """Whether the ATen argument can carry the ABI argument: same name, and a number is never bound
    from a tensor (``pow_.Scalar``'s tensor ``self`` must not reach ``pow.Scalar``'s number ``self``)."""
    if aten is None:
        return arg.name in _ABSENT_MEANS  # the ATen overload has no such argument: its meaning is fixed
    aten_is_tensor = isinstance(aten.type, torch.TensorType) or "Tensor" in str(aten.type)
    return arg.is_tensor or arg.is_tensor_list or not aten_is_tensor


def _servable(op: OpSchema, bound: dict[str, Any]) -> str | None:
    """Why the library cannot serve these ATen arguments (arguments the ABI does not carry), or None."""
    if op.aten.startswith("aten::_scaled_dot_product_flash_attention_for_cpu"):
        if bound.get("dropout_p", 0.0) != 0.0 or bound.get("attn_mask") is not None:
            return "dropout or an attention mask"
    if op.aten in ("aten::index.Tensor", "aten::index_put"):
        if any(t is not None and t.dtype in (torch.bool, torch.uint8) for t in bound.get("indices", ())):
            return "a boolean mask index (its result's size depends on the data)"
    return None


def _scalar(op: OpSchema, kind: str, name: str, bound: dict[str, Any]) -> Any:
    value = bound.get(name)
    if value is None and (op.aten, name) in SCALAR_DEFAULTS:
        rule, source = SCALAR_DEFAULTS[(op.aten, name)]
        value = _default(rule, bound.get(source))
    if kind == "ints":
        return [] if value is None else [int(value)] if isinstance(value, int) else list(value)
    if kind == "int" and name == "approximate" and isinstance(value, str):
        return GELU_APPROXIMATE[value]
    if kind == "double":
        return float(value)
    if kind == "int":
        return int(value)
    return bool(value)


class Router:
    """Serves ``__torch_dispatch__`` of device tensors; counts routed and fallen-back operators."""

    def __init__(self, library: DiopiLibrary, wrap: Callable[[torch.Tensor], torch.Tensor],
                 is_device: Callable[[Any], bool]) -> None:
        self.library = library
        self.wrap = wrap
        self.is_device = is_device
        self._routed: Counter[str] = Counter()
        self.fallbacks: Counter[str] = Counter()
        self.copies: Counter[str] = Counter()
        self._resolved: dict[Any, tuple[OpSchema | None, bool]] = {}
        self._metas: dict[tuple, Any] = {}

    @property
    def routed(self) -> Counter[str]:
        """Calls the library served so far, per ATen overload (routed_ops())."""
        return self._routed

    # --- resolution -------------------------------------------------------------------------
    def resolve(self, func: torch._ops.OpOverload) -> tuple[OpSchema | None, str]:
        """The schema operator serving ``func`` (or None), and how (FUNCTIONAL, INPLACE, OUT)."""
        hit = self._resolved.get(func)
        if hit is None:
            op, mode = _schema_form(func)
            if op is not None and not self.library.implements(op.aten):
                op = None
            hit = self._resolved[func] = (op, mode)
        return hit

    # --- dispatch ---------------------------------------------------------------------------
    def dispatch(self, func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
        if _is_view(func) or func._schema.name in _METADATA_OPS or func in _ALLOCATIONS:
            return self._on_host(func, args, kwargs)  # metadata, or memory of the device (host memory)
        if func is torch.ops.aten._local_scalar_dense.default:  # .item(): a copy to the host
            self.copies[aten_name(func)] += 1
            return self._on_host(func, args, kwargs)
        if func in _FILLED_LIKE and not _targets_host(func, kwargs):
            return self._filled_like(func, args, kwargs)
        if _crosses_devices(func, args, kwargs):  # the framework's copies to and from the CPU
            self.copies[aten_name(func)] += 1
            return self._on_host(func, args, kwargs)
        return self.route(func, args, kwargs)

    def copy_counts(self) -> Counter[str]:
        """Copies between the CPU and the device so far (copy_ops())."""
        return Counter(self.copies)

    def fallback_counts(self) -> Counter[str]:
        """Calls run on the CPU so far, per ATen overload (fallback_ops())."""
        return Counter(self.fallbacks)

    def route(self, func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
        """The library's operator for ``func`` if it serves these arguments, else the CPU (logged once)."""
        if func is _STACK:
            stacked = self._stack(_bind(func, args, kwargs))
            if stacked is not None:
                return stacked
        if func in _MASKED_SELECT:
            selected = self._masked_select(func, _bind(func, args, kwargs))
            if selected is not None:
                return selected
        op, mode = self.resolve(func)
        if op is not None:
            bound = _bind(func, args, kwargs)
            if op.aten in _MASK_INDEXED and _has_mask(bound):
                indices = self._mask_indices(bound["self"], bound["indices"])
                if indices is not None:  # the masks' nonzero columns, computed by the library
                    return self.route(func, *_replaced(func, args, kwargs, "indices", indices))
            reason = _servable(op, bound)
            if reason is None:
                try:
                    if any(a.is_allocated for a in op.outputs):
                        return self._call_allocating(func, op, mode, bound)
                    return self._call(func, op, mode, args, kwargs, bound)
                except (OperatorError, _Unservable, DtypeError) as exc:  # DtypeError: raised before the call
                    reason = str(exc)
            self._log_fallback(func, reason)
        else:
            self._log_fallback(func, None)
        return self._on_host(func, args, kwargs)

    def _filled_like(self, func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
        """``ones_like``, ``zeros_like``, ``full_like``: device memory, then the library's fill."""
        bound = _bind(func, args, kwargs)
        value = _FILLED_LIKE[func](bound)
        options = {k: v for k, v in kwargs.items() if k != "fill_value"}
        empty = self._on_host(torch.ops.aten.empty_like.default, (bound["self"],), options)
        return self.dispatch(torch.ops.aten.fill_.Scalar, (empty, value), {})

    def _call(self, func: torch._ops.OpOverload, op: OpSchema, mode: str, args: tuple, kwargs: dict,
              bound: dict[str, Any]) -> Any:
        meta_out = self._meta(func, args, kwargs)
        metas = list(meta_out) if isinstance(meta_out, (tuple, list)) else [meta_out]
        out_names = _out_names(func) if mode == OUT else ["self"] if mode == INPLACE else []
        targets = [bound[name] for name in out_names]
        for name, target, meta in zip(out_names, targets, metas):
            if mode == OUT and target.numel() == 0 and tuple(target.shape) != tuple(meta.shape):
                target.resize_(meta.shape)  # as torch does for an empty out= (arange's)
            if tuple(target.shape) != tuple(meta.shape):
                raise _Unservable(f"the result's shape {tuple(meta.shape)} is not the shape of "
                                  f"{name} {tuple(target.shape)}")
        device = self._device_of(bound)
        host = {name: self._operand(value, device) for name, value in bound.items()}
        outputs: dict[str, torch.Tensor | None] = {}
        results = []
        direct = [False] * len(op.outputs)
        for i, (arg, meta) in enumerate(zip(op.outputs, metas)):
            out_name = out_names[i] if mode == OUT else None
            if arg.kind == "inout":
                outputs[arg.name] = host[arg.name]
                results.append(bound[arg.name])
            elif meta is None or not isinstance(meta, torch.Tensor):
                outputs[arg.name] = None
                results.append(meta)
            elif out_name is not None and _writable_as(out_name, meta, host):
                direct[i] = True
                outputs[arg.name] = host[out_name]  # out= has the result's layout: the library writes it
                results.append(bound[out_name])
            else:
                out = self._new_output(meta, device)
                outputs[arg.name] = out
                results.append(out)
        abi_args = []
        for arg in op.args:
            if arg.is_output:
                abi_args.append(outputs[arg.name])
            elif arg.is_tensor_list:
                abi_args.append([None if t is None else self._operand(t, device) for t in bound[arg.name]])
            elif arg.is_tensor:
                value = host.get(arg.name)
                if isinstance(value, (int, float, bool)):  # a Python number where ATen takes a tensor
                    value = torch.tensor(value, dtype=metas[0].dtype, device=self._library_device(device))
                abi_args.append(value)
            else:
                abi_args.append(_scalar(op, arg.kind, arg.name, bound))
        self._run(op, abi_args, device)
        self._routed[aten_name(func)] += 1
        if targets:  # the functional results go into self (in place) or the out= arguments
            for arg, target, written in zip(op.outputs, targets, direct):
                if not written:
                    self._operand(target, device).copy_(outputs[arg.name])
            return targets[0] if len(targets) == 1 else tuple(targets)
        wrapped = [r if not isinstance(r, torch.Tensor) or self.is_device(r) else self.wrap(r) for r in results]
        return tuple(wrapped) if isinstance(meta_out, (tuple, list)) else wrapped[0]

    def _call_allocating(self, func: torch._ops.OpOverload, op: OpSchema, mode: str, bound: dict[str, Any]) -> Any:
        """An operator whose outputs the kernel allocates (``out*``, nonzero): no meta kernel can size them;
        the library allocates them on the call's device through the context and the call returns them."""
        if mode == INPLACE:
            raise _Unservable("the library allocates this operator's result; an in-place form cannot take it")
        device = self._device_of(bound)
        abi_args = []
        for arg in op.args:
            if arg.is_allocated:
                abi_args.append(self._library_device(device))
            elif arg.is_output:
                raise _Unservable(f"{op.aten} mixes allocated and preallocated outputs")
            elif arg.is_tensor:
                abi_args.append(self._operand(bound.get(arg.name), device))
            elif arg.is_tensor_list:
                abi_args.append([None if t is None else self._operand(t, device) for t in bound[arg.name]])
            else:
                abi_args.append(_scalar(op, arg.kind, arg.name, bound))
        targets = [bound[name] for name in _out_names(func)] if mode == OUT else []
        if not all(self.is_device(t) for t in targets):
            raise _Unservable("an out= argument off the device")
        made = self._run(op, abi_args, device) or ()
        results = [r if self.is_device(r) else self.wrap(r) for r in made]
        if any(t.dtype != r.dtype for t, r in zip(targets, results)):  # the CPU raises torch's error
            raise _Unservable("an out= argument of another dtype than the result's")
        self._routed[aten_name(func)] += 1
        for target, result in zip(targets, results):  # out=: resized to the library's result, as torch does
            if tuple(target.shape) != tuple(result.shape):
                self.dispatch(torch.ops.aten.resize_.default, (target, list(result.shape)), {})
            self.dispatch(torch.ops.aten.copy_.default, (target, result), {})
        if targets:
            return targets[0] if len(targets) == 1 else tuple(targets)
        return results[0] if len(results) == 1 else tuple(results)

    def _masked_select(self, func: torch._ops.OpOverload, bound: dict[str, Any]) -> Any:
        """``masked_select``: the input indexed by the mask, both broadcast to one shape (torch's own rule), so
        the library's nonzero and index serve it. None (the CPU, with torch's errors) for a mask that is not
        boolean or does not broadcast, an operand off the device, or a library without nonzero or index."""
        source, mask, out = bound["self"], bound["mask"], bound.get("out")
        if (not self.is_device(source) or not self.is_device(mask) or mask.dtype != torch.bool
                or (out is not None and (not self.is_device(out) or out.dtype != source.dtype))
                or self.resolve(torch.ops.aten.nonzero.default)[0] is None
                or self.resolve(torch.ops.aten.index.Tensor)[0] is None):
            return None
        try:
            shape = list(torch.broadcast_shapes(source.shape, mask.shape))
        except RuntimeError:
            return None
        if not shape:  # a 0-dim mask is no index list's mask
            return None
        expand = torch.ops.aten.expand.default
        selected = self.dispatch(torch.ops.aten.index.Tensor,
                                 (self.dispatch(expand, (source, shape), {}),
                                  [self.dispatch(expand, (mask, shape), {})]), {})
        if out is None:
            return selected
        self.dispatch(torch.ops.aten.resize_.default, (out, list(selected.shape)), {})
        self.dispatch(torch.ops.aten.copy_.default, (out, selected), {})
        return out

    def _stack(self, bound: dict[str, Any]) -> Any:
        """``stack``: ``cat`` of the tensors, each with a dim of size 1 inserted (a view). None (the CPU, with
        torch's errors) for an empty list, tensors off the device or of other shapes, a library without cat."""
        tensors, dim = list(bound["tensors"]), bound.get("dim", 0)
        if (not tensors or not all(self.is_device(t) for t in tensors)
                or len({tuple(t.shape) for t in tensors}) != 1 or self.resolve(torch.ops.aten.cat.default)[0] is None):
            return None
        ndim = tensors[0].dim() + 1
        if not -ndim <= dim < ndim:
            return None
        unsqueeze = torch.ops.aten.unsqueeze.default
        parts = [self.dispatch(unsqueeze, (t, dim), {}) for t in tensors]
        return self.dispatch(torch.ops.aten.cat.default, (parts, dim), {})

    def _mask_indices(self, base: Any, indices: list) -> list | None:
        """An index list with each boolean mask replaced by the columns of its nonzero (torch's own rule:
        a mask of k dims indexes the k dims it stands for), nonzero computed by the library. None when the
        library lacks nonzero or a mask does not match the dims it indexes (then the CPU raises torch's error)."""
        nonzero = torch.ops.aten.nonzero.default
        if self.resolve(nonzero)[0] is None:
            return None
        converted: list = []
        dim = 0
        for index in indices:
            if index is None or index.dtype not in _MASK_DTYPES:
                converted.append(index)
                dim += 1
                continue
            k = index.dim()
            if k == 0 or tuple(index.shape) != tuple(base.shape[dim:dim + k]):
                return None
            columns = self.dispatch(nonzero, (index,), {}) if self.is_device(index) else index.nonzero()
            converted.extend(columns.unbind(1))
            dim += k
        return converted

    # --- what differs between the host-memory stand-in and the native device (native.py) ----------
    def _device_of(self, bound: dict[str, Any]) -> Any:
        """The device the call runs on (the stand-in has one, and needs none)."""
        return None

    def _operand(self, value: Any, device: Any) -> Any:
        """What the library reads for an argument: the host tensor behind a device tensor."""
        return _host(value)

    def _library_device(self, device: Any) -> torch.device:
        return _CPU

    def _new_output(self, meta: torch.Tensor, device: Any) -> torch.Tensor:
        return torch.empty_strided(meta.shape, meta.stride(), dtype=meta.dtype)

    def _run(self, op: OpSchema, abi_args: list, device: Any) -> tuple[torch.Tensor, ...] | None:
        return self.library.call(op, *abi_args)

    def _meta(self, func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
        """The operator's meta result (output sizes, strides, dtypes), cached per argument signature: the
        meta kernels are Python (torch._refs) and cost more than a small kernel; a training step repeats
        the same signatures every step."""
        key = _meta_key(func, args, kwargs)
        hit = self._metas.get(key) if key is not None else None
        if hit is None:
            hit = func(*tree_map(_to_meta, args), **tree_map(_to_meta, kwargs))
            if key is not None:
                if len(self._metas) >= _META_CACHE_SIZE:
                    self._metas.clear()
                self._metas[key] = hit
        return hit

    def _on_host(self, func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
        """Run ``func`` on the host tensors behind the device tensors; device results stay device tensors."""
        inputs: dict[int, torch.Tensor] = {}

        def unwrap(x: Any) -> Any:
            if self.is_device(x):
                inner = x.host
                inputs[id(inner)] = x
                return inner
            if isinstance(x, torch.device) and x.type == DEVICE_TYPE:
                return _CPU
            return x

        out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs))
        if _writes_any(func):
            self._refresh_metadata(inputs.values())
        leaves_host = _targets_host(func, kwargs)

        def wrap(x: Any) -> Any:
            if not isinstance(x, torch.Tensor) or leaves_host:
                return x
            same = inputs.get(id(x))  # an in-place or out= result: the caller's own device tensor
            return same if same is not None else self.wrap(x)

        return tree_map(wrap, out)

    def _refresh_metadata(self, tensors: Any) -> None:
        """A device tensor's sizes and strides are set when it is made; an operator that changed its host
        tensor's (an ``out=`` it resized, ``resize_``, ``unsqueeze_``, ``t_``) gives it the new ones."""
        for t in tensors:
            h = t.host
            if t.shape != h.shape or t.stride() != h.stride() or t.storage_offset() != h.storage_offset():
                t.data = self.wrap(h)  # shallow-copies the fresh tensor's metadata, keeps the Python object

    def _log_fallback(self, func: torch._ops.OpOverload, reason: str | None) -> None:
        name = aten_name(func)
        if name not in self.fallbacks:
            why = f" ({reason})" if reason else f" ({self.library.vendor} does not implement it)"
            logger.info("diopi: %s runs on the CPU%s", name, why)
        self.fallbacks[name] += 1


_MASKED_SELECT = frozenset({torch.ops.aten.masked_select.default, torch.ops.aten.masked_select.out})
_STACK = torch.ops.aten.stack.default

# Index lists in which a boolean (or uint8) mask stands for the columns of its nonzero.
_MASK_INDEXED = frozenset({"aten::index.Tensor", "aten::index_put"})
_MASK_DTYPES = (torch.bool, torch.uint8)


def _has_mask(bound: dict[str, Any]) -> bool:
    return any(t is not None and t.dtype in _MASK_DTYPES for t in bound.get("indices", ()))


def _replaced(func: torch._ops.OpOverload, args: tuple, kwargs: dict, name: str, value: Any) -> tuple[tuple, dict]:
    """``args``/``kwargs`` with ATen argument ``name`` set to ``value``, wherever it was passed."""
    position = [a.name for a in func._schema.arguments].index(name)
    if position < len(args):
        return (*args[:position], value, *args[position + 1:]), kwargs
    return args, {**kwargs, name: value}


def _out_names(func: torch._ops.OpOverload) -> list[str]:
    """The arguments an overload writes other than ``self`` (``out``, ``grad_input``, max's ``max, max_values``)."""
    return [a.name for a in func._schema.arguments
            if a.alias_info is not None and a.alias_info.is_write and a.name != "self"]


def _out_name(func: torch._ops.OpOverload) -> str | None:
    """The one argument an ``out=`` overload writes (``out``, ``grad_input``...), or None."""
    written = [a.name for a in func._schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    return written[0] if len(written) == 1 else None


def _writable_as(out_name: str, meta: torch.Tensor, operands: dict[str, Any]) -> bool:
    """Whether the library may write ``out=`` directly: the result's sizes, strides and dtype, and no
    input shares its memory (an ``out`` that is also an input must not be written while read)."""
    out = operands[out_name]
    if not (isinstance(out, torch.Tensor) and out.shape == meta.shape and out.stride() == meta.stride()
            and out.dtype == meta.dtype):
        return False
    storage = out.untyped_storage().data_ptr()
    for name, value in operands.items():
        values = value if isinstance(value, (list, tuple)) else (value,)
        for v in values:
            if name != out_name and isinstance(v, torch.Tensor) and v.untyped_storage().data_ptr() == storage:
                return False
    return True


def _writes_self(func: torch._ops.OpOverload) -> bool:
    returns = func._schema.returns
    return len(returns) == 1 and returns[0].alias_info is not None and returns[0].alias_info.is_write


def _writes_any(func: torch._ops.OpOverload) -> bool:
    return any(a.alias_info is not None and a.alias_info.is_write for a in func._schema.arguments)


def _is_view(func: torch._ops.OpOverload) -> bool:
    returns = func._schema.returns
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)


def _crosses_devices(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> bool:
    if func is torch.ops.aten.copy_.default:
        return args[0].device != args[1].device
    return func is torch.ops.aten._to_copy.default and _targets_host(func, kwargs)


def _targets_host(func: torch._ops.OpOverload, kwargs: dict) -> bool:
    """Whether ``func`` moves its result off the device (``.to("cpu")``, ``.cpu()``)."""
    device = kwargs.get("device")
    return device is not None and torch.device(device).type != DEVICE_TYPE


def _bind(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> dict[str, Any]:
    bound: dict[str, Any] = {}
    for i, arg in enumerate(func._schema.arguments):
        if i < len(args) and not arg.kwarg_only:
            bound[arg.name] = args[i]
        elif arg.name in kwargs:
            bound[arg.name] = kwargs[arg.name]
        elif arg.has_default_value():
            bound[arg.name] = arg.default_value
    return bound


def _host(value: Any) -> Any:
    return getattr(value, "host", value) if isinstance(value, torch.Tensor) else value


_META_CACHE_SIZE = 8192
# Argument values kept as they are in a meta-cache key.
_KEY_VALUES = (int, float, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)
# Float arguments that scale values and never sizes: keyed by type only, since optimizer steps pass new
# ones every step. Any other float (arange's end, interpolate's scale factors) is keyed by its value.
_SIZE_FREE_FLOATS = frozenset({"alpha", "beta", "value", "scale", "eps", "weight_decay", "lr", "exponent",
                               "other", "self", "ord", "p", "negative_slope", "min", "max", "weight"})


class _NoKey(Exception):
    pass


def _signature(x: Any, name: str = "") -> Any:
    if isinstance(x, torch.Tensor):
        return (x.shape, x.stride(), x.dtype)
    if isinstance(x, float) and name in _SIZE_FREE_FLOATS:
        return float
    if isinstance(x, _KEY_VALUES):
        return (type(x), x)  # True and 1 are equal keys otherwise
    if isinstance(x, (list, tuple)):
        return tuple(_signature(e) for e in x)
    raise _NoKey


def _meta_key(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> tuple | None:
    names = [a.name for a in func._schema.arguments]
    try:
        positional = tuple(_signature(v, names[i] if i < len(names) else "") for i, v in enumerate(args))
        return (func, positional, tuple((k, _signature(v, k)) for k, v in kwargs.items()))
    except _NoKey:
        return None


def _to_meta(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
    if isinstance(x, torch.device):
        return torch.device("meta")
    return x
