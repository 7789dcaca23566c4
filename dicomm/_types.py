"""Translation of torch dtypes and reduce ops into the engine's names."""
from __future__ import annotations

import torch
import torch.distributed as dist

_DTYPES: dict[torch.dtype, str] = {
    torch.float32: "float32", torch.float64: "float64", torch.float16: "float16",
    torch.bfloat16: "bfloat16", torch.int8: "int8", torch.int16: "int16", torch.int32: "int32",
    torch.int64: "int64", torch.uint8: "uint8", torch.bool: "bool",
}

_R = dist.ReduceOp.RedOpType
_OPS: dict[object, str] = {
    _R.SUM: "sum", _R.AVG: "avg", _R.PRODUCT: "product", _R.MIN: "min", _R.MAX: "max",
    _R.BAND: "band", _R.BOR: "bor", _R.BXOR: "bxor",
}
_BITWISE = {"band", "bor", "bxor"}


def dtype_name(dtype: torch.dtype, what: str) -> str:
    """The engine's name for a dtype that can be reduced; a clear error for the others."""
    try:
        return _DTYPES[dtype]
    except KeyError:
        raise TypeError(f"dicomm {what}: cannot reduce tensors of dtype {dtype}; supported: "
                        f"{', '.join(str(d) for d in _DTYPES)}") from None


def reduce_op(op: dist.ReduceOp, dtype: torch.dtype, what: str) -> tuple[str, object | None]:
    """(engine op name, pre-multiplication factor or None) for a torch ReduceOp."""
    kind = op.op if isinstance(op, dist.ReduceOp) else op
    if kind == _R.PREMUL_SUM:
        return "sum", op.factor
    try:
        name = _OPS[kind]
    except KeyError:
        raise ValueError(f"dicomm {what}: unsupported reduce op {kind}") from None
    if name in _BITWISE and (dtype.is_floating_point or dtype.is_complex):
        raise TypeError(f"dicomm {what}: bitwise reduce op {name} needs an integer or bool "
                        f"tensor, got {dtype}")
    return name, None
