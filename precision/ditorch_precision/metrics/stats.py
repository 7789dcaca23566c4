"""Error statistics between a result and its reference, computed in float64 on the CPU."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import torch

@dataclass
class ErrorStats:
    """Errors of ``actual`` against ``expected`` over the positions where both are finite."""

    numel: int
    max_abs: float
    max_rel: float  # |a - e| / max(|e|, tiny of the actual dtype)
    mean_rel: float
    cosine: float
    max_ulp: int | None  # in the actual dtype; None for non-float dtypes
    within_0_1pct: float  # share of elements with relative error <= 0.1%
    within_0_5pct: float
    nan_mismatch: int  # positions where exactly one side is NaN
    inf_mismatch: int  # positions where the Inf sign differs or one side only is Inf
    masked: int = 0  # positions masked on both sides in two encodings: -inf and the dtype's lowest (``masked_alike``)

    def to_dict(self) -> dict:
        return asdict(self)


def _np64(t: torch.Tensor) -> np.ndarray:
    t = t.detach().to("cpu")
    if t.is_complex():
        t = torch.view_as_real(t.to(torch.complex128))
    return t.to(torch.float64).numpy().reshape(-1)


def _ordered_bits(bits: np.ndarray) -> np.ndarray:
    """Map float bit patterns (as signed ints of the float's width) to unsigned ints in value order."""
    b = bits.astype(np.int64)
    magnitude = np.int64((1 << (8 * bits.dtype.itemsize - 1)) - 1)
    # Floats are sign-magnitude: negate the negatives' magnitude, then shift the range to unsigned.
    ordered = np.where(b < 0, -(b & magnitude), b)
    return ordered.view(np.uint64) ^ np.uint64(1 << 63)


def _bits(t: torch.Tensor, dtype: torch.dtype) -> np.ndarray:
    int_dtype = {16: torch.int16, 32: torch.int32, 64: torch.int64}[torch.finfo(dtype).bits]
    return t.detach().to("cpu", dtype).contiguous().reshape(-1).view(int_dtype).numpy()


def ulp_distance(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype | None = None) -> np.ndarray:
    """Units in the last place between the two, both rounded to ``dtype`` (default: actual's)."""
    dtype = dtype or actual.dtype
    ua, ue = _ordered_bits(_bits(actual, dtype)), _ordered_bits(_bits(expected, dtype))
    return np.where(ua >= ue, ua - ue, ue - ua)


def _near_lowest(x: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    """Finite values that round to the dtype's lowest within 4 ulps: a mask value plus a score."""
    if not dtype.is_floating_point:
        return np.zeros(x.shape, dtype=bool)
    low = -float(torch.finfo(dtype).max)
    return np.isfinite(x) & (x <= low * (1 - 4 * float(torch.finfo(dtype).eps)))


def masked_alike(a: np.ndarray, e: np.ndarray, actual: torch.Tensor, expected: torch.Tensor) -> np.ndarray:
    """Positions where one side is -inf and the other its dtype's lowest finite value: two encodings
    of "masked" (an attention mask built with -inf by one implementation, with finfo.min by another).
    Equal only where a softmax over the last dimension maps both to 0: each such position's row must
    hold a position both sides leave unmasked (finite, not near the lowest), since a row masked
    everywhere gives NaN from -inf and a uniform row from finfo.min."""
    pair = ((a == -np.inf) & _near_lowest(e, expected.dtype)) | ((e == -np.inf) & _near_lowest(a, actual.dtype))
    if not pair.any() or actual.dim() == 0:
        return np.zeros(a.shape, dtype=bool)
    width = actual.shape[-1]
    live = np.isfinite(a) & np.isfinite(e) & ~_near_lowest(a, actual.dtype) & ~_near_lowest(e, expected.dtype)
    rows_live = live.reshape(-1, width).any(axis=1)
    return (pair.reshape(-1, width) & rows_live[:, None]).reshape(-1)


def error_stats(actual: torch.Tensor, expected: torch.Tensor) -> ErrorStats:
    """All statistics of ``actual`` against ``expected`` (shapes must already match)."""
    a, e = _np64(actual), _np64(expected)
    nan_a, nan_e = np.isnan(a), np.isnan(e)
    inf_a = np.where(np.isinf(a), np.sign(a), 0.0)
    inf_e = np.where(np.isinf(e), np.sign(e), 0.0)
    nan_mismatch = int(np.count_nonzero(nan_a != nan_e))
    masked = masked_alike(a, e, actual, expected) if (inf_a != inf_e).any() else np.zeros(a.shape, dtype=bool)
    inf_mismatch = int(np.count_nonzero((inf_a != inf_e) & ~nan_a & ~nan_e & ~masked))
    finite = np.isfinite(a) & np.isfinite(e)
    af, ef = a[finite], e[finite]
    n = int(af.size)
    floating = actual.dtype.is_floating_point or actual.dtype.is_complex
    if n == 0:
        return ErrorStats(int(a.size), 0.0, 0.0, 0.0, 1.0, 0 if floating else None, 1.0, 1.0, nan_mismatch,
                          inf_mismatch, int(masked.sum()))
    diff = np.abs(af - ef)
    tiny = torch.finfo(actual.dtype).tiny if actual.dtype.is_floating_point else 1.0
    rel = diff / np.maximum(np.abs(ef), tiny)
    # Plain reductions, not BLAS dot: BLAS threads spin badly on a busy machine.
    na, ne = math.sqrt(float(np.add.reduce(af * af))), math.sqrt(float(np.add.reduce(ef * ef)))
    if na == 0.0 and ne == 0.0:
        cosine = 1.0
    elif na == 0.0 or ne == 0.0:
        cosine = 0.0
    else:
        cosine = float(np.clip(float(np.add.reduce(af * ef)) / (na * ne), -1.0, 1.0))
    max_ulp = None
    if actual.dtype.is_floating_point:
        ulps = ulp_distance(actual, expected)[finite]  # numpy masking: torch bool-indexing is slow here
        max_ulp = int(ulps.max()) if ulps.size else 0
    return ErrorStats(
        numel=int(a.size),
        max_abs=float(diff.max()),
        max_rel=float(rel.max()),
        mean_rel=float(rel.mean()),
        cosine=cosine if not math.isnan(cosine) else 0.0,
        max_ulp=max_ulp,
        within_0_1pct=float(np.count_nonzero(rel <= 1e-3) / n),
        within_0_5pct=float(np.count_nonzero(rel <= 5e-3) / n),
        nan_mismatch=nan_mismatch,
        inf_mismatch=inf_mismatch,
        masked=int(masked.sum()),
    )
