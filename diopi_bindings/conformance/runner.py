"""Running conformance cases against a library and judging them against the float64 reference.

A case passes when the call returned success, no input tensor was modified, and every output passes
three rules (docs/diopi.md, "Conformance rules"), with bounds per dtype and per case:

- element: |actual - expected| <= rtol * max(|expected|, floor) + 2 K u_acc m + the dtype's subnormal
  step (+ the vendor file's atol), where floor = 1e-3 * max|expected| (smaller elements are judged
  absolutely), K the case's reduction length, u_acc the unit roundoff of the accumulation (float32's
  for float32/float16/bfloat16, float64's for float64) and m the element's error scale (its own
  |value|, the sum of |terms|, or the output's largest |value|). At most 0.1% of the elements may lie
  outside (DIOPI's suite allows that share), each within 8 times its bound. Where m is not the
  element's own |value| (terms that cancel), 2 u m more: the terms may be rounded to the output dtype.
- mean: on the elements that matter (|expected| >= floor), sum |actual - expected| / sum |expected| <=
  MEAN_ULPS[dtype] * u + (the element rule's m coefficient) * c, c = sum m / sum |expected|.
- bias: on the same elements, |sum (actual - expected) sign(expected)| / sum |expected| <=
  BIAS_ULPS[dtype] * u + 2.9 u / sqrt(n_eff) + sqrt(K) u_acc c (1 + 4 / sqrt(n_eff)), n_eff =
  min((sum |expected|)^2 / sum expected^2, distinct expected values): a rounding error is unbiased, a
  wrong kernel usually is not.
  u is the output dtype's unit roundoff.

A systematic 0.1% error fails in every floating dtype: by the element rule in float32/float64, by the
mean rule in float16, by the bias rule in bfloat16 (where 0.1% is a quarter of an ulp). A vendor file's
rtol replaces the element rtol and raises the mean and bias bounds to at least it.

Each operator runs in a forked child process: a kernel that crashes fails the case it crashed in
("crash", with the signal), and the operator's remaining cases run in a new child.

The library is one of the project's ABI (``library.DiopiLibrary``) or one written to DeepLink's DIOPI
(``diopi_named.DiopiNamedLibrary``: the same cases through the native device's DIOPI routes).
"""
from __future__ import annotations

import faulthandler
import json
import math
import os
import select
import signal
from dataclasses import dataclass, field
from typing import Any

import torch

from diopi_bindings.conformance.cases import Case, _dtype_name, cases_for
from diopi_bindings.conformance.diopi_named import Declined, DiopiNamedLibrary
from diopi_bindings.conformance.vendor import VendorFile
from diopi_bindings.library import DiopiLibrary, OperatorError
from diopi_bindings.schema import BY_NAME
from ditorch_precision.metrics import Verdict
from ditorch_precision.metrics.stats import error_stats
from ditorch_precision.metrics.tolerance import Tolerance
from ditorch_precision.metrics.verdict import _exact_verdict, _nan_inf_verdict, _shape_verdict

# Share of elements that may lie outside the element bound (DIOPI's suite allows 0.1%), and how far.
OUTLIER_SHARE = 0.001
OUTLIER_FACTOR = 8.0
# Below this share of an output's largest |value| an element is judged absolutely (it does not "matter").
FLOOR_SHARE = 1e-3

# Per output dtype: the element rule's rtol, and the mean and bias bounds in units of the dtype's unit
# roundoff u (eps / 2). An honest kernel rounds once, or computes in float32 and rounds (mean error
# about u/3, bias near 0); float16's and bfloat16's element rtol alone would let 0.1% through.
ELEMENT_RTOL = {torch.float64: 1e-7, torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1.6e-2}
MEAN_ULPS = {torch.float64: 1e6, torch.float32: 16.0, torch.float16: 1.0, torch.bfloat16: 1.0}
BIAS_ULPS = {torch.float64: 1e5, torch.float32: 2.0, torch.float16: 0.125, torch.bfloat16: 0.0625}

PASS, FAIL, ERROR, NOT_IMPLEMENTED, SKIPPED = "pass", "fail", "error", "not implemented", "skipped"
CRASH, TIMEOUT = "crash", "timeout"
# A DIOPI library answered diopiNoImplement, diopiForceFallbackToCPU or diopiDtypeNotSupported: the case ran
# on the CPU and is not judged (listed in the summary, as a skip is).
DECLINED = "declined"
FAILING = (FAIL, ERROR, CRASH, TIMEOUT)

# A library of the project's ABI, or one written to DeepLink's DIOPI (diopi_named.py).
Library = DiopiLibrary | DiopiNamedLibrary


@dataclass
class CaseResult:
    op: str
    case: str
    dtype: str
    status: str
    detail: str = ""
    verdicts: dict[str, dict] = field(default_factory=dict)
    function: str = ""  # the library's function the case called (diopi_aten_neg, diopiSoftmax)

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "case": self.case, "dtype": self.dtype, "status": self.status, "detail": self.detail,
                "verdicts": self.verdicts, "function": self.function}


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


def _unit_roundoff(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps / 2


def _accumulation_roundoff(dtype: torch.dtype) -> float:
    """Reductions accumulate in float32 at least (float64 for float64), as ATen's kernels do."""
    return _unit_roundoff(torch.float64 if dtype == torch.float64 else torch.float32)


def _judge(actual: torch.Tensor, expected: torch.Tensor, tolerance: dict[str, float], reduction_length: int = 1,
           magnitude: torch.Tensor | str | None = None) -> Verdict:
    """One output against its float64 reference by the element, mean and bias rules (module doc)."""
    if (v := _shape_verdict(actual, expected)) is not None:
        return v
    if not (actual.dtype.is_floating_point and expected.dtype.is_floating_point):
        return _exact_verdict(actual, expected)
    stats = error_stats(actual, expected)
    if (v := _nan_inf_verdict(stats)) is not None:
        return v
    dtype = actual.dtype
    info = torch.finfo(dtype)
    u, u_acc = _unit_roundoff(dtype), _accumulation_roundoff(dtype)
    vendor_rtol, atol = tolerance.get("rtol"), float(tolerance.get("atol", 0.0))
    rtol = ELEMENT_RTOL.get(dtype, 8 * info.eps) if vendor_rtol is None else float(vendor_rtol)
    tol = Tolerance(rtol, atol)
    a, e = actual.detach().cpu().double().reshape(-1), expected.detach().cpu().double().reshape(-1)
    finite = a.isfinite() & e.isfinite()
    a, e = a[finite], e[finite]
    if isinstance(magnitude, torch.Tensor):
        m = magnitude.detach().cpu().double().reshape(-1)[finite].abs()
    n = e.numel()
    if n == 0:
        return Verdict(True, "element", "no finite elements to compare", stats, tol)
    k = max(int(reduction_length), 1)
    ae = e.abs()
    scale = float(ae.max())
    if magnitude is None:
        m = ae
    elif magnitude == "scale":
        m = torch.full_like(ae, scale)
    floor = max(FLOOR_SHARE * scale, info.tiny)
    acc = 2 * k * u_acc if k > 1 else 0.0
    if magnitude is not None:  # the cancelling terms may be held in the output's dtype: one rounding each
        acc += 2 * u
    bound = rtol * torch.clamp(ae, min=floor) + acc * m + info.tiny * info.eps + atol
    err = (a - e).abs()
    over = err > bound
    bad = int(over.sum())
    rule = f"rtol={rtol:g}, K={k}"
    if bad:
        allowed = math.floor(OUTLIER_SHARE * n)
        far = bool((err[over] > OUTLIER_FACTOR * bound[over]).any())
        if bad > allowed or far:
            worst = int(torch.argmax(err / bound))
            why = (f"{bad} of {n} elements outside the element bound ({rule})" if bad > allowed else
                   f"an element {float(err[worst] / bound[worst]):.3g} times its bound ({rule})")
            return Verdict(False, "element", f"{why}; worst: {float(a[worst]):.6g} for {float(e[worst]):.6g}",
                           stats, tol)
    matter = ae >= floor
    total = float(ae[matter].sum())
    if total > 0:
        diff = (a - e)[matter]
        mean = float(diff.abs().sum()) / total
        bias = abs(float((diff * torch.sign(e[matter])).sum())) / total
        # inputs in a narrow dtype repeat values, and a value repeated rounds the same way each time: the
        # noise averages over distinct values only
        n_eff = min(total ** 2 / float((ae[matter] ** 2).sum()), torch.unique(e[matter]).numel())
        conditioning = float(m[matter].sum()) / total
        loose = max(vendor_rtol or 0.0, 0.0) + atol * int(matter.sum()) / total
        mean_bound = max(MEAN_ULPS.get(dtype, 1.0) * u, loose) + acc * conditioning
        # rounding errors are unbiased: what remains is their noise over n_eff elements (5 sigma), and
        # the accumulation's error, about sqrt(K) u_acc per element
        noise = 2.9 * u / math.sqrt(n_eff)
        bias_bound = (max(BIAS_ULPS.get(dtype, 0.125) * u + noise, loose)
                      + (math.sqrt(k) * u_acc * conditioning * (1 + 4 / math.sqrt(n_eff)) if k > 1 else 0.0))
        if mean > mean_bound:
            return Verdict(False, "mean", f"mean error {mean:.3g} of |expected| over {int(matter.sum())} elements "
                           f"that matter, bound {mean_bound:.3g} ({rule})", stats, tol)
        if bias > bias_bound:
            return Verdict(False, "bias", f"bias {bias:.3g} of |expected| over {int(matter.sum())} elements that "
                           f"matter (results systematically {'large' if float(diff.sum()) > 0 else 'small'}), bound "
                           f"{bias_bound:.3g} ({rule})", stats, tol)
    detail = f"within the element, mean and bias bounds ({rule})"
    if bad:
        detail += f" ({bad} of {n} within the {OUTLIER_SHARE:.1%} rule)"
    return Verdict(True, "element", detail, stats, tol)


def _abs_inputs(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.dtype.is_floating_point:
        return value.double().abs()
    if isinstance(value, list):
        return [_abs_inputs(v) for v in value]
    return value


def _magnitudes(case: Case, expected: list) -> list:
    """Per output: the error scale of the case's ``magnitude`` ("abs": the reference on |inputs|)."""
    if case.magnitude != "abs":
        return [case.magnitude] * len(expected)
    with torch.no_grad() if not case.op.aten.endswith("_backward") else torch.enable_grad():
        made = case.reference({k: _abs_inputs(v) for k, v in case.inputs.items()})
    return [None if t is None else t.detach().abs() for t in made]


def prepare(case: Case) -> Case:
    """The case's float64 reference outputs and error scales, computed once."""
    if case.expected is None:
        with torch.no_grad() if not case.op.aten.endswith("_backward") else torch.enable_grad():
            case.expected = tuple(case.reference({k: _to64(v) for k, v in case.inputs.items()}))
        case.magnitudes = _magnitudes(case, list(case.expected))
    return case


def judge_case(case: Case, actual: list, expected: list, tolerance: dict[str, float]) -> list[Verdict]:
    """Every output of ``case`` against its float64 reference (None where the case wants no output)."""
    magnitudes = _magnitudes(case, expected)
    return [_judge(a, e, tolerance, case.reduction_length, m)
            for a, e, m in zip(actual, expected, magnitudes) if e is not None]


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


def run_case(lib: Library, case: Case, vendor: VendorFile, device: torch.device | None = None) -> CaseResult:
    """One case; ``device``: run it on tensors of that device (the native diopi device), same layouts."""
    op, dtype = case.op, _dtype_name(case.dtype)
    result = CaseResult(op.aten, case.label, dtype, PASS, function=_function(lib, op.aten))
    expected = prepare(case).expected
    assert expected is not None and case.magnitudes is not None
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
    except Declined as exc:
        result.status, result.detail = DECLINED, str(exc)
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
    for arg, want, magnitude in zip(op.outputs, expected, case.magnitudes):
        if want is None:
            continue
        verdict = _judge(outputs[arg.name], want, tolerance, case.reduction_length, magnitude)
        result.verdicts[arg.name] = verdict.to_dict()
        if not verdict.passed and result.status == PASS:
            result.status, result.detail = FAIL, f"{arg.name}: {verdict.rule}: {verdict.detail}"
    return result


def _guarded(lib: Library, case: Case, vendor: VendorFile, device: torch.device | None) -> CaseResult:
    """run_case, with an exception of the framework's own side (a reference, a copy) as the case's error."""
    try:
        return run_case(lib, case, vendor, device)
    except Exception as exc:  # noqa: BLE001 (any failure is this case's, the run goes on)
        return CaseResult(case.op.aten, case.label, _dtype_name(case.dtype), ERROR,
                          f"{type(exc).__name__}: {exc}", function=_function(lib, case.op.aten))


def _function(lib: Any, op: str) -> str:
    """The library function a case of ``op`` calls: the project's ABI symbol, or a DIOPI function's name."""
    named = getattr(lib, "function", None)
    return named(op) if named is not None else BY_NAME[op].symbol


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _in_children(lib: Library, cases: list[Case], vendor: VendorFile, device: torch.device | None,
                 case_timeout: float) -> list[CaseResult]:
    """``cases`` run in forked children, one after the other: a child that dies (a crash in a kernel)
    or runs past ``case_timeout`` seconds in one case fails that case, and a new child runs the rest."""
    results: list[CaseResult] = []
    start = 0
    while start < len(cases):
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: one JSON line per case started and per result
            os.close(read_end)
            code = 0
            try:
                faulthandler.disable()  # a crash is reported with its case by the parent, not as a traceback dump
                torch.set_num_threads(1)  # OpenMP's pool of the parent does not survive a fork
                with os.fdopen(write_end, "w", buffering=1) as pipe:
                    for i in range(start, len(cases)):
                        pipe.write(json.dumps({"start": i}) + "\n")
                        pipe.write(json.dumps({"done": i, **_guarded(lib, cases[i], vendor, device).to_dict()}) + "\n")
            except BaseException:  # noqa: BLE001 (the parent reports the case it had not finished)
                code = 3
            finally:
                os._exit(code)
        os.close(write_end)
        started, buffer, timed_out = None, b"", False
        with os.fdopen(read_end, "rb", buffering=0) as pipe:
            while True:
                ready, _, _ = select.select([pipe], [], [], case_timeout)
                if not ready:
                    timed_out = True
                    os.kill(pid, signal.SIGKILL)
                    break
                chunk = pipe.read(1 << 16)
                if not chunk:
                    break
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    message = json.loads(line)
                    if "start" in message:
                        started = message["start"]
                    else:
                        message.pop("done")
                        verdicts = message.pop("verdicts")
                        results.append(CaseResult(**message, verdicts=verdicts))
                        started = None
        _, status = os.waitpid(pid, 0)
        if started is None:
            break  # every case of this child reported
        case = cases[started]
        if timed_out:
            status_name, detail = TIMEOUT, f"no result after {case_timeout:g} s (the process was killed)"
        elif os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            status_name, detail = CRASH, f"the process died of {_signal_name(sig)} in this case"
        else:
            status_name, detail = CRASH, f"the process exited with status {os.WEXITSTATUS(status)} in this case"
        results.append(CaseResult(case.op.aten, case.label, _dtype_name(case.dtype), status_name,
                                  f"{detail} ({_function(lib, case.op.aten)})", function=_function(lib, case.op.aten)))
        start = started + 1
    return results


def run(lib: Library, ops: list[str] | None = None, vendor: VendorFile | None = None,
        progress: Any = None, quick: bool = False, device: torch.device | None = None,
        isolate: bool = True, case_timeout: float = 600.0) -> list[CaseResult]:
    """Every case of ``ops`` (default: the whole schema; ``quick``: no large cases, the long ones kept).
    A missing function is "not implemented"; an operator a DIOPI library cannot be asked for (no DIOPI
    function in the table) is skipped. ``isolate``: each operator's cases in forked children."""
    vendor = vendor or VendorFile()
    isolate = isolate and hasattr(os, "fork")
    results = []
    unroutable = getattr(lib, "unroutable", {})
    for name in ops or list(BY_NAME):
        op = BY_NAME[name]
        if name in unroutable:
            results.append(CaseResult(name, "*", ",".join(op.dtypes), SKIPPED, unroutable[name]))
            continue
        if not lib.implements(name):
            results.append(CaseResult(name, "*", ",".join(op.dtypes), NOT_IMPLEMENTED,
                                      f"{lib.vendor} does not export {_function(lib, name)}",
                                      function=_function(lib, name)))
            continue
        to_run = []
        for case in cases_for(name, quick=quick):
            dtype = _dtype_name(case.dtype)
            reason = vendor.skip_reason(name, dtype)
            if reason is not None:
                results.append(CaseResult(name, case.label, dtype, SKIPPED, reason))
            else:
                to_run.append(case)
        if isolate:
            ready = []
            for case in to_run:  # references in this process: autograd may not run in a forked child
                try:
                    ready.append(prepare(case))
                except Exception as exc:  # noqa: BLE001 (the case's error; the run goes on)
                    results.append(CaseResult(name, case.label, _dtype_name(case.dtype), ERROR,
                                              f"the reference failed: {type(exc).__name__}: {exc}"))
            results += _in_children(lib, ready, vendor, device, case_timeout)
        else:
            results += [_guarded(lib, case, vendor, device) for case in to_run]
        if progress is not None:
            progress(name, [r for r in results if r.op == name])
    return results
