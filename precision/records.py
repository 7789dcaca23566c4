"""What every tool records about one op call."""
from __future__ import annotations

import os
import traceback
from dataclasses import asdict, dataclass

import torch

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))
_EXAMPLES_DIR = os.path.join(_PKG_DIR, "examples")
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))


def _is_user_frame(filename: str) -> bool:
    if filename.startswith(_EXAMPLES_DIR):
        return True
    return not filename.startswith((_PKG_DIR, _TORCH_DIR)) and "<frozen" not in filename


@dataclass
class OpRecord:
    index: int  # call order of the op among all ops seen by the tool (selected or not)
    op: str  # ATen op name, e.g. "aten::mm"
    overload: str  # e.g. "default"
    phase: str  # forward | backward | recompute | optimizer
    module: str | None  # innermost module path, e.g. "TinyLlama.layers.0.mlp.w1"
    step: int
    rank: int
    callsite: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def op_names(func) -> tuple[str, str]:
    """('aten::mm', 'default') for torch.ops.aten.mm.default."""
    return func._schema.name, func._overloadname


def resolve_op(op: str, overload: str = "default"):
    """The OpOverload for a recorded name; a clear error if this torch does not have it."""
    ns, _, name = op.partition("::")
    try:
        packet = getattr(getattr(torch.ops, ns), name)
        return getattr(packet, overload)
    except (AttributeError, RuntimeError) as exc:
        raise LookupError(f"op {op}.{overload} is not available in torch {torch.__version__}") from exc


def user_stack(limit: int = 8) -> list[str]:
    """The innermost frames outside torch and this package, as 'file:line in func'."""
    frames = [f for f in traceback.extract_stack()[:-1] if _is_user_frame(f.filename)]
    return [f"{f.filename}:{f.lineno} in {f.name}" for f in frames[-limit:]]


def callsite() -> str | None:
    stack = user_stack(1)
    return stack[-1] if stack else None
