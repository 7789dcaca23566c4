"""Inf/NaN and range checks of floating tensors for overflow_check.

The exact check (``torch.isfinite``) allocates a mask and is slow on a CPU; it runs only where a
one-pass screen fires. The screen never misses: a sum holds Inf/NaN whenever an element does
(it may also overflow on finite data: then the exact check decides), and the largest |x| of a
tensor with a NaN is NaN, which no bound accepts."""
from __future__ import annotations

import math

import torch
from torch.utils._pytree import tree_leaves

# Ops whose outputs only copy, rearrange or select their inputs' values or given constants: from
# finite inputs they cannot make Inf/NaN, so overflow_check need not look at them. Conservative:
# no op that converts a dtype (a narrowing copy can overflow) and no arithmetic.
VALUE_PRESERVING = frozenset({
    "aten::clone", "aten::_unsafe_view", "aten::cat", "aten::stack", "aten::index", "aten::index_select",
    "aten::gather", "aten::embedding", "aten::masked_fill", "aten::masked_fill_", "aten::where", "aten::relu",
    "aten::threshold_backward", "aten::slice_backward", "aten::select_backward", "aten::zero_", "aten::fill_",
    "aten::zeros", "aten::ones", "aten::zeros_like", "aten::ones_like", "aten::new_zeros", "aten::new_ones",
})

# Dtypes the screen handles (others go straight to the exact check); 16-bit sums accumulate in float32
# (a float16 sum of finite data overflows too easily to be a useful screen).
_SUM_DTYPES = {torch.float32: None, torch.float64: None, torch.float16: torch.float32, torch.bfloat16: torch.float32}


def floats(tree) -> list[torch.Tensor]:
    """The non-empty floating tensors of a tree, in order."""
    return [t for t in tree_leaves(tree) if isinstance(t, torch.Tensor) and t.dtype.is_floating_point and t.numel()]


def nonfinite_scalars(tree) -> bool:
    return any(isinstance(x, float) and not math.isfinite(x) for x in tree_leaves(tree))


def screen_ok(t: torch.Tensor, range_max: float | None) -> bool:
    """True: ``t`` certainly holds no Inf/NaN (and, with ``range_max``, no |x| above it).
    False: it may; ask ``problem``. One reduction and one host read."""
    if t.dtype not in _SUM_DTYPES:
        return False
    if range_max is not None:
        lo, hi = torch.aminmax(t)
        return max(-float(lo), float(hi)) <= range_max  # NaN compares false
    return math.isfinite(t.sum(dtype=_SUM_DTYPES[t.dtype]).item())


def problem(t: torch.Tensor, i: int, range_max: float | None) -> tuple[str, str] | None:
    """The exact check of output ``i``: (kind, detail) or None."""
    if not bool(torch.isfinite(t).all()):
        n_nan, n_inf = int(t.isnan().sum()), int(t.isinf().sum())
        return ("nan" if n_nan else "inf"), f"output {i}: {n_nan} NaN, {n_inf} Inf of {t.numel()}"
    if range_max is not None:
        peak = float(t.abs().max())
        if peak > range_max:
            return "range", f"output {i}: |max| {peak:.4g} exceeds {range_max:.4g}"
    return None


def first_problem(tensors: list[torch.Tensor], range_max: float | None) -> tuple[str, str] | None:
    """The first tensor's problem, in order; the exact check only where the screen fires."""
    for i, t in enumerate(tensors):
        if not screen_ok(t, range_max):
            found = problem(t, i, range_max)
            if found is not None:
                return found
    return None


def device_stats(t: torch.Tensor, range_max: float | None) -> torch.Tensor:
    """[NaN count, Inf count(, max |x|)] as float64 on ``t``'s device, with no synchronisation:
    the no-sync mode reads many of these at once."""
    parts = [t.isnan().sum(), t.isinf().sum()]
    if range_max is not None:
        parts.append(t.abs().amax())
    return torch.stack([p.to(torch.float64) for p in parts])


def stats_problem(row: list[float], i: int, numel: int, range_max: float | None) -> tuple[str, str] | None:
    """``problem`` from a row of ``device_stats``: the same verdict and detail."""
    n_nan, n_inf = int(row[0]), int(row[1])
    if n_nan or n_inf:
        return ("nan" if n_nan else "inf"), f"output {i}: {n_nan} NaN, {n_inf} Inf of {numel}"
    if range_max is not None and row[2] > range_max:
        return "range", f"output {i}: |max| {row[2]:.4g} exceeds {range_max:.4g}"
    return None


def read_stats(rows: list[torch.Tensor]) -> list[list[float]]:
    """Rows of ``device_stats`` as lists, in order, with one transfer per device."""
    out: list = [None] * len(rows)
    groups: dict = {}
    for i, r in enumerate(rows):
        groups.setdefault(r.device, []).append(i)
    for idx in groups.values():
        for i, values in zip(idx, torch.stack([rows[i] for i in idx]).cpu().tolist()):
            out[i] = values
    return out
