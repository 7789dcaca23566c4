"""The conformance cases run against a library written to DeepLink's DIOPI (functions named ``diopiAdd``,
``diopiSoftmax``, ... over opaque handles read through the DIOPI runtime), with no shim.

The library is attached to the native diopi device (``deeplink.attach``): its handles, scratch memory,
streams and generators are the device's DIOPI runtime (``csrc_diopi/diopirt.cpp``). A case of the schema's
operator ``aten::X`` calls the out= overload of ``aten::X`` that ``diopi_functions.yaml`` routes to a DIOPI
function (``add.out`` -> ``diopiAdd``; an in-place operator itself), on device tensors with the case's
layouts, into the case's preallocated outputs, so the library writes through the outputs' strides as it
does in training. The route's counters tell whether the library served the call or declined it
(``diopiNoImplement``, ``diopiForceFallbackToCPU``, ``diopiDtypeNotSupported``: the router then ran it on
the CPU, and the case is "declined", not judged). An operator of the schema that the table maps to no DIOPI
function cannot be checked through DIOPI; the run lists it as skipped, with that reason.
"""
from __future__ import annotations

import ctypes
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from diopi_bindings.library import OperatorError
from diopi_bindings.schema import BY_NAME, OpSchema

# Schema operators checked through an overload that is not the out= form of their own name.
_OVERLOADS = {
    "aten::index_put": "aten::_index_put_impl_",  # into out, a copy of self: diopiIndexPutInp
    "aten::arange.start_step": "aten::arange.start_out",
}
# Checked through the functional overload, its result copied into the case's output.
_FUNCTIONAL = {
    "aten::embedding_dense_backward",  # torch's meta kernel of embedding_dense_backward.out refuses out=
    "aten::index.Tensor",  # the router's meta call of index.Tensor_out meets device index tensors
}
# ATen arguments the project's ABI leaves implicit, from the case's arguments (by ABI name).
_DERIVED: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "aten::embedding_dense_backward": lambda a: {"num_weights": a["grad_weight"].shape[0]},
    "aten::_softmax_backward_data": lambda a: {"input_dtype": a["grad_input"].dtype},
    "aten::_log_softmax_backward_data": lambda a: {"input_dtype": a["grad_input"].dtype},
}


class Declined(RuntimeError):
    """The library answered a call with diopiNoImplement, diopiForceFallbackToCPU or diopiDtypeNotSupported."""


def exports_diopi_names(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a library written to DeepLink's DIOPI: it exports ``diopiGetVersion``, which a
    library of the project's ABI does not (it may link one: the reference under DIOPI's names does)."""
    if not Path(path).is_file():
        return False
    try:
        # lazily bound: the DIOPI runtime functions it calls need not be loaded to read its symbols
        dll = ctypes.CDLL(str(path), mode=os.RTLD_LOCAL | os.RTLD_LAZY)
    except OSError:
        return False
    return hasattr(dll, "diopiGetVersion")


def _packet(aten: str) -> Any:
    name, _, overload = aten.removeprefix("aten::").partition(".")
    return getattr(getattr(torch.ops.aten, name), overload or "default")


def _is_out_form(aten: str) -> bool:
    return any(a.kwarg_only and a.alias_info is not None and a.alias_info.is_write
               for a in _packet(aten)._schema.arguments)


@dataclass(frozen=True)
class Route:
    """How one schema operator reaches the library: the ATen overload called and the DIOPI function."""

    op: str
    aten: str
    function: str


def routes_of(table: list[tuple[str, str]]) -> tuple[dict[str, Route], dict[str, str]]:
    """Per schema operator, its route (from the generated table's (ATen overload, DIOPI function) pairs);
    and per operator without one, why."""
    by_aten = dict(table)
    routes, unroutable = {}, {}
    for name, op in BY_NAME.items():
        chosen = _OVERLOADS.get(name)
        if name in _FUNCTIONAL:
            chosen = name
        elif chosen is None and name in by_aten:
            function = by_aten[name]
            base = name.partition(".")[0]
            forms = [a for a, f in table if f == function and a.partition(".")[0] == base and a != name
                     and _is_out_form(a)]
            in_place = all(a.kind == "inout" for a in op.outputs)  # fill_: the operator writes its argument
            chosen = forms[0] if forms else name if in_place else None
        if chosen is None or chosen not in by_aten:
            unroutable[name] = (f"diopi_functions.yaml maps no DIOPI function to {name} (or to its out= form): "
                                "it cannot be checked through DIOPI")
            continue
        routes[name] = Route(name, chosen, by_aten[chosen])
    return routes, unroutable


@dataclass(frozen=True)
class DiopiNamedInfo:
    path: str
    vendor: str
    version: str
    implemented: tuple[str, ...]
    missing: tuple[str, ...]

    @property
    def title(self) -> str:
        return f"{self.vendor} ({self.version}, DeepLink DIOPI names): {self.path}"

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "vendor": self.vendor, "version": self.version, "interface": "DIOPI",
                "implemented": list(self.implemented), "missing": list(self.missing)}


class DiopiNamedLibrary:
    """A DIOPI-named library attached to the native device, called as the suite's runner calls a library
    of the project's ABI (``implements``, ``call`` with arguments in ABI order, ``info``)."""

    def __init__(self, path: str | os.PathLike) -> None:
        from diopi_bindings import deeplink, device

        self.path = str(path)
        device.enable(backend="native")
        attached = deeplink.attach(self.path)  # DiopiLoadError: another major version, no diopiGetVersion
        self.vendor = str(attached["vendor"]) or Path(self.path).name
        self.version = str(attached["version"])
        self.device = torch.device("diopi", 0)
        routed = set(attached["routed"])
        self.routes, self.unroutable = routes_of(deeplink.route_table())
        self.exported = {name for name, r in self.routes.items() if r.aten in routed}

    def info(self) -> DiopiNamedInfo:
        return DiopiNamedInfo(self.path, self.vendor, self.version,
                              tuple(n for n in self.routes if n in self.exported),
                              tuple(n for n in self.routes if n not in self.exported))

    def implements(self, op: str) -> bool:
        return op in self.exported

    def function(self, op: str) -> str:
        """The DIOPI function a case of ``op`` calls."""
        route = self.routes.get(op)
        return route.function if route is not None else "(none)"

    def missing_reason(self, op: str) -> str:
        return self.unroutable.get(op) or f"{self.vendor} does not export {self.function(op)}"

    def call(self, op: OpSchema, *args: Any) -> None:
        """Run ``op`` with arguments in ABI order (device tensors; outputs preallocated, written in place)."""
        from diopi_bindings import _C_diopi

        route = self.routes[op.aten]
        abi = {a.name: v for a, v in zip(op.args, args)}
        if op.aten == "aten::index_put":
            abi["out"].copy_(abi.pop("self"))  # out starts as self; the library puts values into it in place
        packet = _packet(route.aten)
        schema = packet._schema.arguments
        # the overload's out= arguments are the ABI's outputs, in order, whatever their names
        outs = [a.name for a in schema if a.kwarg_only and a.alias_info is not None and a.alias_info.is_write]
        renames = dict(zip((a.name for a in op.outputs), outs)) if op.aten not in _FUNCTIONAL else {}
        if op.aten == "aten::index_put":
            renames = {"out": "self"}
        named = {renames.get(k, k): v for k, v in abi.items()}
        derived = _DERIVED.get(op.aten)
        if derived is not None:
            named.update(derived(abi))
        tensors = [abi.get(a.name) for a in (*op.inputs, *op.outputs)]
        floating = next((t.dtype.is_floating_point for t in tensors if isinstance(t, torch.Tensor)), True)
        positional, keywords = [], {}
        for arg in schema:
            if arg.name not in named:
                continue  # its default
            value = _aten_value(named[arg.name], arg.name, str(arg.type), floating)
            if arg.kwarg_only:
                keywords[arg.name] = value
            else:
                positional.append(value)
        before = _counts(_C_diopi, route.aten)
        try:
            made = packet(*positional, **keywords)
            if op.aten in _FUNCTIONAL:
                for arg, result in zip(op.outputs, made if isinstance(made, tuple) else (made,)):
                    abi[arg.name].copy_(result)
        except RuntimeError as exc:
            raise OperatorError(f"{route.function} ({route.aten})", -1, str(exc).splitlines()[0]) from None
        routed, declined = (a - b for a, b in zip(_counts(_C_diopi, route.aten), before))
        if declined:
            raise Declined(f"{route.function} declined the call (diopiNoImplement, diopiForceFallbackToCPU or "
                           "diopiDtypeNotSupported): it ran on the CPU and was not judged")
        if not routed:
            raise OperatorError(f"{route.function} ({route.aten})", -1,
                                "the call did not reach the library (another kernel served it)")


def _counts(module: Any, aten: str) -> tuple[int, int]:
    for name, _, routed, fallback in module.route_counts():
        if name == aten:
            return routed, fallback
    return 0, 0


def _aten_value(value: Any, name: str, kind: str, floating: bool) -> Any:
    """A case's ABI value as the ATen argument ``name`` of type ``kind`` takes it. For integer tensors: integral
    scalars as ints (ATen refuses a float alpha there), an infinite optional bound (the ABI's absent clamp bound)
    as None, another clamp bound as the integer bound it means (ATen refuses a float bound into an integer out);
    floating tensors take the value itself."""
    if kind not in ("number", "Optional[number]") or not isinstance(value, float) or floating:
        return value
    if kind == "Optional[number]" and math.isinf(value):
        return None
    if value.is_integer():
        return int(value)
    return math.ceil(value) if name == "min" else math.floor(value) if name == "max" else value
