"""Running conformance cases against a library and judging them with ``ditorch_precision.metrics``.

A case passes when every output matches the float64 reference within the dtype's tolerance (the
vendor file may loosen it), allowing at most 0.1% of the elements outside it (the rule of DIOPI's own
suite), when no input tensor was modified, and when the call returned success.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from ditorch_diopi.conformance.cases import Case, _dtype_name, cases_for
from ditorch_diopi.conformance.vendor import VendorFile
from ditorch_diopi.library import DiopiLibrary, OperatorError
from ditorch_diopi.schema import BY_NAME
from ditorch_precision.metrics import Verdict, compare_tensors

# Share of elements that may lie outside the tolerance (DIOPI's suite allows 0.1%).
OUTLIER_SHARE = 0.001

PASS, FAIL, ERROR, NOT_IMPLEMENTED, SKIPPED = "pass", "fail", "error", "not implemented", "skipped"


@dataclass
class CaseResult:
    op: str
    case: str
    dtype: str
    status: str
    detail: str = ""
    verdicts: dict[str, dict] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "case": self.case, "dtype": self.dtype, "status": self.status, "detail": self.detail,
                "verdicts": self.verdicts}


def _to64(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.dtype.is_floating_point:
        return value.double()
    if isinstance(value, list):
        return [_to64(v) for v in value]
    return value


def _allocate(case: Case, name: str, like: torch.Tensor) -> torch.Tensor:
    dtype = case.out_dtypes.get(name, case.dtype if like.dtype.is_floating_point else like.dtype)
    shape = tuple(like.shape)
    if name in case.transposed_outputs and len(shape) >= 2:
        return torch.empty(*shape[:-2], shape[-1], shape[-2], dtype=dtype).transpose(-1, -2)
    return torch.empty(shape, dtype=dtype)


def _outliers_within_share(actual: torch.Tensor, expected: torch.Tensor, verdict: Verdict) -> int | None:
    """How many elements lie outside the verdict's tolerance, if within the 0.1% share; else None."""
    if verdict.rule != "allclose" or verdict.tolerance is None:
        return None
    a, e = actual.double(), expected.double()
    outside = ((a - e).abs() > verdict.tolerance.atol + verdict.tolerance.rtol * e.abs()) & a.isfinite() & e.isfinite()
    bad = int(outside.sum())
    return bad if bad <= math.floor(OUTLIER_SHARE * a.numel()) else None


def _judge(actual: torch.Tensor, expected: torch.Tensor, tolerance: dict[str, float]) -> Verdict:
    verdict = compare_tensors(actual, expected, dtype=actual.dtype, **tolerance)
    if not verdict.passed:
        bad = _outliers_within_share(actual, expected, verdict)
        if bad is not None:
            verdict.passed = True
            verdict.detail += f" ({bad} of {actual.numel()} within the {OUTLIER_SHARE:.1%} rule)"
    return verdict


def _snapshot(value: Any) -> Any:
    return [None if v is None else v.clone() for v in value] if isinstance(value, list) else value.clone()


def _unmodified(before: Any, after: Any) -> bool:
    if isinstance(before, list):
        return all((b is None and a is None) or _unmodified(b, a) for b, a in zip(before, after))
    if before.dtype.is_floating_point:
        return bool(torch.equal(before.isnan(), after.isnan()) and torch.equal(before.nan_to_num(), after.nan_to_num()))
    return bool(torch.equal(before, after))


def _place(value: Any, device: torch.device | None) -> Any:
    """``value`` on ``device`` with the same layout: its whole storage moves, so a strided or offset
    view stays one (``.to`` would make it contiguous)."""
    if device is None or not isinstance(value, (torch.Tensor, list)):
        return value
    if isinstance(value, list):
        return [_place(v, device) for v in value]
    n = value.untyped_storage().nbytes() // value.element_size()
    flat = torch.empty(0, dtype=value.dtype).set_(value.untyped_storage(), 0, (n,), (1,))
    return flat.to(device).as_strided(value.shape, value.stride(), value.storage_offset())


def _to_host(value: Any) -> Any:
    if isinstance(value, list):
        return [_to_host(v) for v in value]
    return value.cpu() if isinstance(value, torch.Tensor) else value


def run_case(lib: DiopiLibrary, case: Case, vendor: VendorFile, device: torch.device | None = None) -> CaseResult:
    """One case; ``device``: run it on tensors of that device (the native diopi device), same layouts."""
    op, dtype = case.op, _dtype_name(case.dtype)
    result = CaseResult(op.aten, case.label, dtype, PASS)
    with torch.no_grad() if not op.aten.endswith("_backward") else torch.enable_grad():
        expected = case.reference({k: _to64(v) for k, v in case.inputs.items()})
    outputs = {}
    for arg, want in zip(op.outputs, expected):
        if want is None or arg.is_allocated:  # an optional output the case does not ask for; the kernel's own
            outputs[arg.name] = None
        else:
            outputs[arg.name] = (case.inputs[arg.name].clone() if arg.kind == "inout"
                                 else _allocate(case, arg.name, want))
    snapshots = {a.name: _snapshot(case.inputs[a.name]) for a in op.inputs if case.inputs.get(a.name) is not None}
    placed = {name: _place(value, device) for name, value in case.inputs.items()}
    outputs = {name: _place(value, device) for name, value in outputs.items()}
    args = [device if a.is_allocated else outputs[a.name] if a.is_output else placed.get(a.name) for a in op.args]
    try:
        made = lib.call(op, *args)
    except OperatorError as exc:
        result.status, result.detail = ERROR, str(exc)
        return result
    for arg, tensor in zip([a for a in op.outputs if a.is_allocated], made or ()):
        if device is not None and tensor.device != device:
            result.status, result.detail = FAIL, f"{arg.name} was allocated on {tensor.device}, not {device}"
            return result
        outputs[arg.name] = tensor
    outputs = {name: _to_host(value) for name, value in outputs.items()}
    touched = [n for n, before in snapshots.items() if not _unmodified(before, _to_host(placed[n]))]
    if touched:
        result.status, result.detail = FAIL, f"modified its input(s) {', '.join(touched)}"
        return result
    tolerance = vendor.tolerance_for(op.aten, dtype)
    for arg, want in zip(op.outputs, expected):
        if want is None:
            continue
        verdict = _judge(outputs[arg.name], want, tolerance)
        result.verdicts[arg.name] = verdict.to_dict()
        if not verdict.passed and result.status == PASS:
            result.status, result.detail = FAIL, f"{arg.name}: {verdict.rule}: {verdict.detail}"
    return result


def run(lib: DiopiLibrary, ops: list[str] | None = None, vendor: VendorFile | None = None,
        progress: Any = None, quick: bool = False, device: torch.device | None = None) -> list[CaseResult]:
    """Every case of ``ops`` (default: the whole schema; ``quick``: no large cases). A missing function
    is "not implemented"."""
    vendor = vendor or VendorFile()
    results = []
    for name in ops or list(BY_NAME):
        op = BY_NAME[name]
        if not lib.implements(name):
            results.append(CaseResult(name, "*", ",".join(op.dtypes), NOT_IMPLEMENTED,
                                      f"{lib.vendor} does not export {op.symbol}"))
            continue
        for case in cases_for(name, quick=quick):
            dtype = _dtype_name(case.dtype)
            reason = vendor.skip_reason(name, dtype)
            if reason is not None:
                results.append(CaseResult(name, case.label, dtype, SKIPPED, reason))
                continue
            results.append(run_case(lib, case, vendor, device))
        if progress is not None:
            progress(name, [r for r in results if r.op == name])
    return results
