"""What every tool records about one op call."""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import torch

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))
_EXAMPLES_DIR = os.path.join(_PKG_DIR, "examples")
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))


_USER_FILE: dict[str, bool] = {}


def _is_user_frame(filename: str) -> bool:
    hit = _USER_FILE.get(filename)
    if hit is None:
        hit = filename.startswith(_EXAMPLES_DIR) or (
            not filename.startswith((_PKG_DIR, _TORCH_DIR)) and "<frozen" not in filename)
        _USER_FILE[filename] = hit
    return hit


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
    api: str | None = None  # the torch-level call the op came from, e.g. "torch.nn.functional.linear"

    def to_dict(self) -> dict:
        # Every field is a plain value: a shallow copy is what asdict would give, without its deep copy.
        return dict(self.__dict__)


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


def user_frames(limit: int = 8, skip: int = 0) -> list[tuple[str, int, str]]:
    """The innermost ``limit`` frames outside torch and this package, outermost first, as
    (file, line, function), starting ``skip`` frames above the caller. Walks the frames without
    reading source lines, so it is cheap enough to take for every op."""
    frame = sys._getframe(1 + skip)
    out = []
    while frame is not None and len(out) < limit:
        code = frame.f_code
        if _is_user_frame(code.co_filename):
            out.append((code.co_filename, frame.f_lineno, code.co_name))
        frame = frame.f_back
    out.reverse()
    return out


def format_frames(frames: list[tuple[str, int, str]]) -> list[str]:
    return [f"{file}:{line} in {name}" for file, line, name in frames]


def user_stack(limit: int = 8) -> list[str]:
    """The innermost frames outside torch and this package, as 'file:line in func'."""
    return format_frames(user_frames(limit, skip=1))


def callsite() -> str | None:
    stack = format_frames(user_frames(1, skip=1))
    return stack[-1] if stack else None
