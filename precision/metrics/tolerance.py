"""Per-dtype tolerances: torch.testing.assert_close's defaults are the floor."""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

# torch.testing.assert_close defaults (rtol, atol): nothing here may be looser-checked than these.
ASSERT_CLOSE_DEFAULTS: dict[torch.dtype, tuple[float, float]] = {
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
    torch.complex32: (1e-3, 1e-5),
    torch.complex64: (1.3e-6, 1e-5),
    torch.complex128: (1e-7, 1e-7),
}

# Defaults for "device result against a reference result" (another device or float64). A reduction
# of K terms legitimately differs from float64 by a few ulps times sqrt(K), so float32 gets more than
# assert_close's same-device rtol; the low-precision types are at their assert_close values.
DEVICE_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float32: (1e-5, 1e-5),
    torch.float64: (1e-7, 1e-7),
    torch.complex64: (1e-5, 1e-5),
    torch.complex128: (1e-7, 1e-7),
}


@dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def floor_tolerance(dtype: torch.dtype) -> Tolerance:
    """assert_close's default for ``dtype`` (8 ulps for dtypes it does not list, e.g. float8)."""
    if dtype in ASSERT_CLOSE_DEFAULTS:
        return Tolerance(*ASSERT_CLOSE_DEFAULTS[dtype])
    if dtype.is_floating_point:
        return Tolerance(8 * torch.finfo(dtype).eps, 1e-5)
    return Tolerance(0.0, 0.0)


def default_tolerance(dtype: torch.dtype) -> Tolerance:
    """The default for comparing a ``dtype`` device result with a reference, never below the floor."""
    floor = floor_tolerance(dtype)
    rtol, atol = DEVICE_TOLERANCES.get(dtype, (floor.rtol, floor.atol))
    return Tolerance(max(rtol, floor.rtol), max(atol, floor.atol))


def resolve_tolerance(dtype: torch.dtype, rtol: float | None = None, atol: float | None = None) -> Tolerance:
    """Explicit values win (a user may tighten); a missing one takes the dtype's default."""
    base = default_tolerance(dtype)
    return Tolerance(base.rtol if rtol is None else float(rtol), base.atol if atol is None else float(atol))
