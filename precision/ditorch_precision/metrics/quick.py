"""A quick pass for the common case, where every output of an op is within tolerance and finite on
both sides: two or three float64 passes instead of the full statistics (ULPs, cosine, shares).

It decides only passes, and only where ``compare_trees`` would pass by the same test computed the
same way; anything else (a failure, NaN/Inf, shapes, counts, complex or mixed dtypes) gives None
and the full comparison decides."""
from __future__ import annotations

import math

import torch

from .tolerance import resolve_tolerance
from .verdict import jsonable, tensor_leaves

_DOUBLE_MAX = torch.finfo(torch.float64).max


def _quick_float(actual: torch.Tensor, expected: torch.Tensor, rtol, atol) -> tuple[str, float] | None:
    tol = resolve_tolerance(actual.dtype, rtol, atol)
    a = actual.detach().to("cpu")
    e = expected.detach().to("cpu", torch.float64)
    diff = torch.sub(a, e)  # promoted to float64: the values the full comparison computes
    diff.abs_()
    max_abs = float(diff.amax())
    if not math.isfinite(max_abs):
        if not _same_infinities(a, e, diff):
            return None
        max_abs = float(diff.amax())
    # Every element's bound atol + rtol * |e| is at least atol, so below it nothing can fail.
    if max_abs > tol.atol:
        bound = e.abs().mul_(tol.rtol)
        bound += tol.atol
        if bool(torch.gt(diff, bound).any()):  # the full comparison's test, with the same roundings
            return None
    return f"within rtol={tol.rtol:g} atol={tol.atol:g}", max_abs


def _same_infinities(a: torch.Tensor, e: torch.Tensor, diff: torch.Tensor) -> bool:
    """Where |a - e| is not finite, are both sides the same infinity? Then (as in the full
    comparison) those places match and the rest is compared: their differences are set to 0.
    A NaN, an infinity on one side only or an overflowing difference: False."""
    off = torch.le(diff, _DOUBLE_MAX).logical_not_()  # NaN compares false: caught too
    if bool((off & torch.ne(a, e)).any()):
        return False
    diff.masked_fill_(off, 0.0)
    return True

def _quick_exact(actual: torch.Tensor, expected: torch.Tensor) -> tuple[str, float] | None:
    a = actual.detach().to("cpu")
    e = expected.detach().to("cpu", a.dtype)
    return ("all elements equal", 0.0) if torch.equal(a, e) else None


def quick_pass(actual, expected, *, rtol: float | None = None, atol: float | None = None) -> dict | None:
    """The summary ``compare_trees(actual, expected).summary()`` would give, with ``max_abs`` as its
    only statistic, when every output passes the quick test; else None."""
    a, e = tensor_leaves(actual), tensor_leaves(expected)
    if not a or len(a) != len(e):
        return None
    first = None
    max_abs = 0.0
    for x, y in zip(a, e):
        if tuple(x.shape) != tuple(y.shape) or not x.numel():
            return None
        if x.dtype.is_floating_point and y.dtype.is_floating_point:
            got = _quick_float(x, y, rtol, atol)
            rule = "allclose"
        elif not (x.dtype.is_floating_point or x.is_complex() or y.dtype.is_floating_point or y.is_complex()):
            got = _quick_exact(x, y)
            rule = "exact"
        else:
            return None
        if got is None:
            return None
        first = first or (rule, got[0])
        max_abs = max(max_abs, got[1])
    return {"passed": True, "rule": first[0], "detail": first[1], "max_abs": jsonable(max_abs)}
