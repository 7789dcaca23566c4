"""An op's arguments as data: its non-tensor arguments (scalars, dims, dtypes, flags, string
options) and its tensor arguments' metadata (shape, dtype), by argument name, so two runs' calls of
one op can be compared argument for argument. A config value, a scale factor or a mask constant
that differs between the runs changes no tensor the op reads, only an argument: replaying each run
from its own inputs cannot see it, comparing the arguments does."""
from __future__ import annotations

import math
from typing import Any

import torch

from .dump import Unsaved
from .records import resolve_op

# Arguments that say where or how a result is stored, not what it is: a device run and a CPU
# reference differ in them by design.
IGNORED = frozenset({"device", "pin_memory", "non_blocking", "memory_format"})
# Python floats of two honest runs are the same config values; a data-derived scalar (``.item()``)
# may differ by float32 rounding
FLOAT_RTOL = 1e-6


def _value(x) -> Any:
    """One argument as a JSON value (tensors by their metadata); None for what is not compared
    (devices, objects that could not be saved, such as a process group or a generator)."""
    if isinstance(x, torch.Tensor):
        return {"shape": list(x.shape), "dtype": str(x.dtype).removeprefix("torch.")}
    if isinstance(x, bool) or x is None or isinstance(x, (int, str)):
        return x
    if isinstance(x, float):
        return x if math.isfinite(x) else str(x)  # JSON has no inf/nan
    if isinstance(x, complex):
        return [_value(x.real), _value(x.imag)]
    if isinstance(x, (list, tuple)):
        return [_value(v) for v in x]
    if isinstance(x, (torch.dtype, torch.layout, torch.memory_format)):
        return str(x).removeprefix("torch.")
    if isinstance(x, slice):
        return {"slice": [_value(x.start), _value(x.stop), _value(x.step)]}
    if isinstance(x, torch.device) or isinstance(x, Unsaved):
        return None
    return None  # script objects and the like: their repr holds addresses


def _schema(op: str, overload: str | None):
    try:
        return resolve_op(op, overload or "default")._schema
    except LookupError:
        return None


# c10's enum values of layouts and memory formats
_LAYOUTS = ("strided", "sparse_coo", "sparse_csr", "_mkldnn", "sparse_csc", "sparse_bsr", "sparse_bsc", "jagged")
_MEMORY_FORMATS = ("contiguous_format", "preserve_format", "channels_last", "channels_last_3d")
# c10::ScalarType's values, in order (a dtype default such as randint's dtype=long reads as an int)
_DTYPE_NAMES = ("uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64", "complex32", "complex64",
                "complex128", "bool", "qint8", "quint8", "qint32", "bfloat16", "quint4x2", "quint2x4", "bits1x8",
                "bits2x4", "bits4x2", "bits8", "bits16", "float8_e5m2", "float8_e4m3fn", "float8_e5m2fnuz",
                "float8_e4m3fnuz", "uint16", "uint32", "uint64")


def _dtype_name(code: int) -> str | int:
    """The name of the dtype whose c10 enum value is ``code``; the int itself if none has it."""
    return _DTYPE_NAMES[code] if 0 <= code < len(_DTYPE_NAMES) else code


def _typed(x, real_type) -> Any:
    """An int where the schema means a dtype, layout or memory format, as its name."""
    kind = str(real_type).removeprefix("Optional[").removesuffix("]")
    if isinstance(x, int) and not isinstance(x, bool):
        if kind == "ScalarType":
            return _dtype_name(x)
        if kind == "Layout" and 0 <= x < len(_LAYOUTS):
            return _LAYOUTS[x]
        if kind == "MemoryFormat" and 0 <= x < len(_MEMORY_FORMATS):
            return _MEMORY_FORMATS[x]
    return _value(x)


def signature(op: str, overload: str | None, args, kwargs) -> dict[str, Any]:
    """{argument name: value} of one call (positional arguments named by the op's schema; by
    position, ``arg2``, for an op this torch does not know)."""
    schema = _schema(op, overload)
    names = [a.name for a in schema.arguments] if schema is not None else []
    types = {a.name: a.real_type for a in schema.arguments} if schema is not None else {}
    out: dict[str, Any] = {}
    for i, a in enumerate(args):
        name = names[i] if i < len(names) else f"arg{i}"
        out[name] = _typed(a, types.get(name))
    for k, v in kwargs.items():
        out[k] = _typed(v, types.get(k))
    for a in schema.arguments if schema is not None else ():
        if a.name not in out and a.has_default_value():  # a default left out is the default given
            out[a.name] = _typed(a.default_value, a.real_type)
    return {k: v for k, v in out.items() if k not in IGNORED and v is not None}


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _same(a, b) -> bool:
    if _number(a) and _number(b):  # 2 and 2.0 are one scale factor
        return a == b or abs(a - b) <= FLOAT_RTOL * max(abs(a), abs(b))
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _show(v) -> str:
    if isinstance(v, dict) and "shape" in v:
        return f"tensor {v['dtype']}{v['shape']}"
    if isinstance(v, list) and v and all(isinstance(x, dict) and "shape" in x for x in v):
        return "[" + ", ".join(_show(x) for x in v) + "]"
    return repr(v)


def differences(sig_a: dict, sig_b: dict, only_shared: bool = False, ignored=()) -> list[str]:
    """What differs between two calls' signatures, each as 'argument NAME: VALUE in A, VALUE in B'.
    ``only_shared``: arguments one call lacks are not differences (equivalent kernels of other
    signatures); otherwise an argument given in one call only is (a default left in the other)."""
    out = []
    for name in list(sig_a) + [k for k in sig_b if k not in sig_a]:
        if name in ignored or ((name not in sig_a or name not in sig_b) and only_shared):
            continue
        if name not in sig_a or name not in sig_b or not _same(sig_a[name], sig_b[name]):
            va = _show(sig_a[name]) if name in sig_a else "not given"
            vb = _show(sig_b[name]) if name in sig_b else "not given"
            out.append(f"argument {name}: {va} in A, {vb} in B")
    return out
