"""Deliberately wrong kernels, to show that the tools find them: an ATen CPU kernel overridden
through torch.library for one dtype, restored on exit."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

import torch

# Honest math for the ops we know how to plant, written with other ops (calling the op itself
# from its own override would recurse).
_FORMULAS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": lambda x: x * torch.sigmoid(x),
    "rsqrt": lambda x: torch.reciprocal(torch.sqrt(x)),
}


@contextmanager
def wrong_kernel(op: str = "silu", scale: float = 1.0 + 1e-3, dtype: torch.dtype = torch.float32) -> Iterator[None]:
    """Within the block, ``aten::<op>`` on CPU returns ``scale`` x the right value for ``dtype``
    inputs (other dtypes, such as a float64 reference, stay right)."""
    if op not in _FORMULAS:
        raise ValueError(f"no honest formula for aten::{op}; known: {', '.join(_FORMULAS)}")
    formula = _FORMULAS[op]

    def kernel(x: torch.Tensor) -> torch.Tensor:
        y = formula(x)
        return y * scale if x.dtype == dtype else y

    lib = torch.library.Library("aten", "IMPL")
    try:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "overriding a previously registered kernel" is the point
            lib.impl(op, kernel, "CPU")
        yield
    finally:
        lib._destroy()
