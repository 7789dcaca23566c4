"""Verdicts: one tensor (or a tree of tensors) against a reference, naming the rule that decided."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from torch.utils._pytree import tree_leaves

from .stats import ErrorStats, error_stats
from .tolerance import Tolerance, resolve_tolerance

# The rules, in the order they are tried; the first that fails decides, else the last one applied.
RULES = ("shape", "nan_inf", "exact", "error_ratio", "allclose")
# Error-ratio rule: the device's error against float64 may be at most K times the reference's.
DEFAULT_RATIO_K = 4.0


def jsonable(value: float | None) -> float | str | None:
    """JSON has no Inf/NaN: write them as strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


@dataclass
class Verdict:
    passed: bool
    rule: str  # which rule decided: one of RULES, or "skipped"
    detail: str = ""
    stats: ErrorStats | None = None
    tolerance: Tolerance | None = None
    ratio: float | None = None  # device error / reference error, for the error_ratio rule
    # a passing error-ratio verdict's errors against float64 ({"max_abs", "max_rel"}) in place of stats
    errors: dict | None = None

    def to_dict(self) -> dict:
        out = {"passed": self.passed, "rule": self.rule, "detail": self.detail, "ratio": jsonable(self.ratio)}
        if self.errors is not None:
            out["errors"] = {k: jsonable(v) for k, v in self.errors.items()}
        out["tolerance"] = self.tolerance.to_dict() if self.tolerance else None
        out["stats"] = {k: jsonable(v) for k, v in self.stats.to_dict().items()} if self.stats else None
        return out


def _is_float(t: torch.Tensor) -> bool:
    return t.dtype.is_floating_point or t.dtype.is_complex


def _shape_verdict(actual: torch.Tensor, expected: torch.Tensor) -> Verdict | None:
    if tuple(actual.shape) != tuple(expected.shape):
        return Verdict(False, "shape", f"shape {tuple(actual.shape)} != expected {tuple(expected.shape)}")
    return None


def _exact_verdict(actual: torch.Tensor, expected: torch.Tensor) -> Verdict:
    a = actual.detach().to("cpu")
    e = expected.detach().to("cpu", a.dtype) if a.dtype != expected.dtype else expected.detach().to("cpu")
    ne = (a != e) & ~(a.isnan() & e.isnan()) if _is_float(a) else a != e
    bad = int(ne.sum())
    stats = error_stats(actual, expected)
    if bad == 0:
        return Verdict(True, "exact", "all elements equal", stats)
    first = tuple(int(i) for i in ne.nonzero()[0])
    return Verdict(False, "exact", f"{bad} of {a.numel()} elements differ, first at {first}", stats)


def _nan_inf_verdict(stats: ErrorStats) -> Verdict | None:
    if stats.nan_mismatch or stats.inf_mismatch:
        return Verdict(False, "nan_inf", f"NaN positions differ at {stats.nan_mismatch}, Inf at {stats.inf_mismatch}",
                       stats)
    return None


def compare_tensors(
    actual: torch.Tensor,
    expected: torch.Tensor,
    *,
    rtol: float | None = None,
    atol: float | None = None,
    exact: bool | None = None,
    dtype: torch.dtype | None = None,
) -> Verdict:
    """``actual`` against ``expected``: |a - e| <= atol + rtol * |e| elementwise, NaN/Inf at the same
    places, exact for integer/bool results. Tolerances default by ``dtype`` (default: actual's)."""
    if (v := _shape_verdict(actual, expected)) is not None:
        return v
    if exact or (exact is None and not (_is_float(actual) and _is_float(expected))):
        return _exact_verdict(actual, expected)
    stats = error_stats(actual, expected)
    if (v := _nan_inf_verdict(stats)) is not None:
        return v
    tol = resolve_tolerance(dtype or actual.dtype, rtol, atol)
    a = actual.detach().to("cpu", torch.float64)
    e = expected.detach().to("cpu", torch.float64)
    finite = a.isfinite() & e.isfinite()
    over = (a - e).abs() > tol.atol + tol.rtol * e.abs()
    over &= finite
    bad = int(over.sum())
    if bad == 0:
        return Verdict(True, "allclose", f"within rtol={tol.rtol:g} atol={tol.atol:g}", stats, tol)
    first = tuple(int(i) for i in over.nonzero()[0])
    detail = f"{bad} of {a.numel()} elements outside rtol={tol.rtol:g} atol={tol.atol:g}, first at {first}"
    return Verdict(False, "allclose", detail, stats, tol)


def _all_finite(t: torch.Tensor) -> bool:
    """No NaN or Inf in a floating tensor: its min and max are finite (a NaN propagates through them)."""
    if not t.numel():
        return True
    t = t.detach()
    if t.is_complex():
        t = torch.view_as_real(t)
    return all(math.isfinite(v) for v in torch.stack(torch.aminmax(t)).tolist())


def _max_abs_error(x: torch.Tensor, ref64: torch.Tensor) -> float:
    return _errors(x, ref64)[0]


def _errors(x: torch.Tensor, ref64: torch.Tensor, tiny: float | None = None) -> tuple[float, float | None]:
    """max |x - ref64| and (given ``tiny``) max |x - ref64| / max(|ref64|, tiny), over positions
    finite in both: ``error_stats``'s max_abs and max_rel, in torch and without its other passes."""
    x64 = x.detach().to("cpu", torch.float64)
    finite = x64.isfinite() & ref64.isfinite()
    if not x64.numel() or not bool(finite.all()):
        if not x64.numel() or not bool(finite.any()):
            return 0.0, None if tiny is None else 0.0
        x64, ref64 = x64[finite], ref64[finite]
    diff = (x64 - ref64).abs()
    if tiny is None:
        return float(diff.max()), None
    return float(diff.max()), float((diff / ref64.abs().clamp_min(tiny)).max())


def compare_error_ratio(
    device: torch.Tensor,
    reference: torch.Tensor,
    fp64: torch.Tensor,
    *,
    k: float = DEFAULT_RATIO_K,
    reference_fp64: torch.Tensor | None = None,
    integers_from_replay: bool = False,
) -> Verdict:
    """The error-ratio rule: max|device - fp64| <= k * max(max|reference - ref_fp64|, half an ulp
    of the largest |fp64| in the device dtype): the reference is credited at least the rounding
    error any result in that dtype has, so a reference that happens to be exact (or nearly: a
    reduction's luck) does not demand an exact device.
    ``reference_fp64`` is the float64 result on the reference run's own inputs (default: ``fp64``).
    NaN/Inf positions of the device must match the reference run's. An integer or bool result must
    equal the reference run's, or with ``integers_from_replay`` (the runs' inputs differ, so the
    reference's result is another computation's) its own replay ``fp64``."""
    reference_fp64 = fp64 if reference_fp64 is None else reference_fp64
    for other in (reference, fp64, reference_fp64):
        if (v := _shape_verdict(device, other)) is not None:
            return v
    if not _is_float(device):
        if integers_from_replay:
            v = _exact_verdict(device, fp64)
            return replace(v, detail=f"{v.detail} with its own replay (its inputs differ from the reference's)")
        return _exact_verdict(device, reference)
    # NaN/Inf positions: the full statistics only when either side holds one (one pass each otherwise)
    if not (_all_finite(device) and _all_finite(reference)):
        if (v := _nan_inf_verdict(error_stats(device, reference))) is not None:
            return v
    ref64 = fp64.detach().to("cpu", torch.float64)
    err_dev, rel_dev = _errors(device, ref64, torch.finfo(device.dtype).tiny if device.dtype.is_floating_point else 1.0)
    err_ref = _max_abs_error(reference, reference_fp64.detach().to("cpu", torch.float64))
    finite = ref64[ref64.isfinite()]
    scale = float(finite.abs().max()) if finite.numel() else 0.0
    eps = torch.finfo(device.dtype).eps if device.dtype.is_floating_point else float(np.finfo(np.float32).eps)
    floor = eps * scale / 2  # half an ulp (eps is the spacing at 1.0: between 1 and 2 ulps of scale)
    ratio = err_dev / err_ref if err_ref > 0 else (0.0 if err_dev == 0 else math.inf)
    passed = err_dev <= k * max(err_ref, floor)
    detail = f"device error {err_dev:.3g} vs reference error {err_ref:.3g} (k={k:g}, floor {floor:.3g})"
    if passed:  # the common case: the full statistics (several numpy passes) only where they explain a failure
        return Verdict(passed, "error_ratio", detail, None, None, ratio, {"max_abs": err_dev, "max_rel": rel_dev})
    return Verdict(passed, "error_ratio", detail, error_stats(device, fp64), None, ratio)


@dataclass
class TreeVerdict:
    """Verdicts for every tensor of an op's outputs; the first failing one decides."""

    verdicts: list[Verdict] = field(default_factory=list)
    detail: str = ""

    @property
    def passed(self) -> bool:
        return all(v.passed for v in self.verdicts)

    @property
    def deciding(self) -> Verdict | None:
        for v in self.verdicts:
            if not v.passed:
                return v
        return self.verdicts[0] if self.verdicts else None

    @property
    def rule(self) -> str:
        d = self.deciding
        return d.rule if d else "skipped"

    def summary(self) -> dict:
        """Worst value of each statistic over the outputs."""
        stats = [v.stats for v in self.verdicts if v.stats is not None]
        d = self.deciding
        out: dict = {"passed": self.passed, "rule": self.rule, "detail": (d.detail if d else self.detail)}
        if stats:
            out.update(
                max_abs=jsonable(max(s.max_abs for s in stats)),
                max_rel=jsonable(max(s.max_rel for s in stats)),
                mean_rel=jsonable(max(s.mean_rel for s in stats)),
                cosine=min(s.cosine for s in stats),
                max_ulp=max((s.max_ulp for s in stats if s.max_ulp is not None), default=None),
                within_0_1pct=min(s.within_0_1pct for s in stats),
                within_0_5pct=min(s.within_0_5pct for s in stats),
            )
        errors = [v.errors for v in self.verdicts if v.errors is not None]
        for key in ("max_abs", "max_rel") if errors else ():  # passing error-ratio verdicts
            values = [e[key] for e in errors if e.get(key) is not None] + [out[key] for key in [key] if key in out]
            if values:
                out[key] = jsonable(max(values))
        ratios = [v.ratio for v in self.verdicts if v.ratio is not None]
        if ratios:
            out["ratio"] = jsonable(max(ratios))
        return out


def tensor_leaves(tree) -> list[torch.Tensor]:
    return [t for t in tree_leaves(tree) if isinstance(t, torch.Tensor)]


def compare_trees(actual, expected, **kwargs) -> TreeVerdict:
    """Pair the tensors of two output trees in order and compare each."""
    a, e = tensor_leaves(actual), tensor_leaves(expected)
    if len(a) != len(e):
        return TreeVerdict([Verdict(False, "shape", f"{len(a)} output tensors != expected {len(e)}")])
    if not a:
        return TreeVerdict([], "no tensor outputs")
    return TreeVerdict([compare_tensors(x, y, **kwargs) for x, y in zip(a, e)])


def compare_trees_ratio(device, reference, fp64, *, k: float = DEFAULT_RATIO_K, reference_fp64=None,
                        integers_from_replay: bool = False) -> TreeVerdict:
    d, r, f = tensor_leaves(device), tensor_leaves(reference), tensor_leaves(fp64)
    rf = f if reference_fp64 is None else tensor_leaves(reference_fp64)
    if not (len(d) == len(r) == len(f) == len(rf)):
        return TreeVerdict([Verdict(False, "shape", f"output tensor counts differ: {len(d)}, {len(r)}, {len(f)}")])
    return TreeVerdict([compare_error_ratio(x, y, z, k=k, reference_fp64=w, integers_from_replay=integers_from_replay)
                        for x, y, z, w in zip(d, r, f, rf)])
