"""diopi-conformance's rules against faults a vendor library really has, with vendor libraries written
here in C and built by the test: a softmax 0.1% wrong on long rows (caught in every floating dtype, in
--quick too, also when the vendor file skips float64), an honest float32 dot product accumulated in
float (passes), a kernel that segfaults on one case (that case fails by name, the run goes on and
writes its report). The rules are also checked against torch's own CPU kernels in each dtype (honest:
they pass) and the same results 0.1% off (they fail). References: float64 torch on the CPU."""
from __future__ import annotations

import json

import pytest
import torch
from diopi_testlib import METADATA_C, compile_c_library

from diopi_bindings.abi import DTYPE_NAMES
from diopi_bindings.conformance.cases import cases_for
from diopi_bindings.conformance.cli import main
from diopi_bindings.conformance.runner import judge_case
from diopi_bindings.schema import BY_NAME

# Loads and stores of every floating dtype through a tensor's strides, in double.
_IO_C = METADATA_C % {"abi": "DIOPI_ABI_VERSION"} + r"""
#include <math.h>
#include <string.h>
static int floating(diopiDtype_t d) {
  return d == DIOPI_DTYPE_FLOAT64 || d == DIOPI_DTYPE_FLOAT32 || d == DIOPI_DTYPE_FLOAT16 ||
         d == DIOPI_DTYPE_BFLOAT16;
}
static double ld(const diopiTensor* t, int64_t off) {
  switch (t->dtype) {
    case DIOPI_DTYPE_FLOAT64: return ((const double*)t->data)[off];
    case DIOPI_DTYPE_FLOAT32: return ((const float*)t->data)[off];
    case DIOPI_DTYPE_FLOAT16: return (double)((const _Float16*)t->data)[off];
    default: {
      uint32_t b = (uint32_t)((const uint16_t*)t->data)[off] << 16;
      float f;
      memcpy(&f, &b, 4);
      return f;
    }
  }
}
static void st(diopiTensor* t, int64_t off, double v) {
  switch (t->dtype) {
    case DIOPI_DTYPE_FLOAT64: ((double*)t->data)[off] = v; break;
    case DIOPI_DTYPE_FLOAT32: ((float*)t->data)[off] = (float)v; break;
    case DIOPI_DTYPE_FLOAT16: ((_Float16*)t->data)[off] = (_Float16)v; break;
    default: {
      float f = (float)v;
      uint32_t b;
      memcpy(&b, &f, 4);
      b += 0x7fff + ((b >> 16) & 1); /* round to nearest even */
      ((uint16_t*)t->data)[off] = (uint16_t)(b >> 16);
    }
  }
}
/* The offset of element `i` (row-major over t's shape, dim `skip` held at 0 when skip >= 0). */
static int64_t offset_of(const diopiTensor* t, int64_t i, int64_t skip) {
  int64_t off = 0;
  for (int64_t d = t->ndim - 1; d >= 0; --d) {
    if (d == skip) continue;
    off += (i % t->shape[d]) * t->strides[d];
    i /= t->shape[d];
  }
  return off;
}
static int64_t numel_without(const diopiTensor* t, int64_t skip) {
  int64_t n = 1;
  for (int64_t d = 0; d < t->ndim; ++d)
    if (d != skip) n *= t->shape[d];
  return n;
}
"""

# Exact softmax (double), then 0.1% too large on rows longer than 1,000: a vendor's long-row path.
SOFTMAX_0_1_PERCENT_C = _IO_C + r"""
diopiError_t diopi_aten__softmax(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t self,
                                 int64_t dim, bool half_to_float) {
  (void)ctx; (void)half_to_float;
  if (!floating(self->dtype)) return DIOPI_ERR_DTYPE;
  if (self->ndim == 0) { st(out, 0, 1.0); return DIOPI_SUCCESS; }
  if (dim < 0) dim += self->ndim;
  int64_t len = self->shape[dim], rows = numel_without(self, dim);
  double factor = len > 1000 ? 1.001 : 1.0;
  for (int64_t r = 0; r < rows; ++r) {
    int64_t in0 = offset_of(self, r, dim), out0 = offset_of(out, r, dim);
    double m = -INFINITY, s = 0.0;
    for (int64_t j = 0; j < len; ++j) m = fmax(m, ld(self, in0 + j * self->strides[dim]));
    for (int64_t j = 0; j < len; ++j) s += exp(ld(self, in0 + j * self->strides[dim]) - m);
    for (int64_t j = 0; j < len; ++j)
      st(out, out0 + j * out->strides[dim], factor * exp(ld(self, in0 + j * self->strides[dim]) - m) / s);
  }
  return DIOPI_SUCCESS;
}
"""

# out = input @ weight^T + bias, each dot product accumulated in order in float (double for float64):
# what a plain vendor kernel does. Honest: it must pass.
HONEST_FLOAT_LINEAR_C = _IO_C + r"""
diopiError_t diopi_aten_linear(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                               diopiConstTensorHandle_t weight, diopiConstTensorHandle_t bias) {
  (void)ctx;
  if (!floating(input->dtype)) return DIOPI_ERR_DTYPE;
  int64_t last = input->ndim - 1, k = input->shape[last], n = weight->shape[0];
  int64_t rows = numel_without(input, last);
  for (int64_t r = 0; r < rows; ++r) {
    int64_t in0 = offset_of(input, r, last), out0 = offset_of(out, r, out->ndim - 1);
    for (int64_t j = 0; j < n; ++j) {
      if (input->dtype == DIOPI_DTYPE_FLOAT64) {
        double acc = 0.0;
        for (int64_t i = 0; i < k; ++i)
          acc += ld(input, in0 + i * input->strides[last]) *
                 ld(weight, j * weight->strides[0] + i * weight->strides[1]);
        if (bias) acc += ld(bias, j * bias->strides[0]);
        st(out, out0 + j * out->strides[out->ndim - 1], acc);
      } else {
        float acc = 0.0f;
        for (int64_t i = 0; i < k; ++i)
          acc += (float)ld(input, in0 + i * input->strides[last]) *
                 (float)ld(weight, j * weight->strides[0] + i * weight->strides[1]);
        if (bias) acc += (float)ld(bias, j * bias->strides[0]);
        st(out, out0 + j * out->strides[out->ndim - 1], acc);
      }
    }
  }
  return DIOPI_SUCCESS;
}
"""

# neg crashes on 0-dim inputs (the "scalar" case); exp is right.
SEGFAULT_C = _IO_C + r"""
static diopiError_t unary(diopiTensorHandle_t out, diopiConstTensorHandle_t self, double (*f)(double)) {
  if (!floating(self->dtype)) return DIOPI_ERR_DTYPE;
  int64_t n = numel_without(self, -1);
  for (int64_t i = 0; i < n; ++i) st(out, offset_of(out, i, -1), f(ld(self, offset_of(self, i, -1))));
  return DIOPI_SUCCESS;
}
static double negate(double x) { return -x; }
diopiError_t diopi_aten_neg(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t self) {
  (void)ctx;
  if (self->ndim == 0) *(volatile int*)0 = 1; /* the bug */
  return unary(out, self, negate);
}
diopiError_t diopi_aten_exp(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t self) {
  (void)ctx;
  return unary(out, self, exp);
}
"""

# exp never returns on a float64 0-dim input; neg is right.
HANG_C = _IO_C + r"""
#include <unistd.h>
static diopiError_t unary(diopiTensorHandle_t out, diopiConstTensorHandle_t self, double (*f)(double)) {
  if (!floating(self->dtype)) return DIOPI_ERR_DTYPE;
  int64_t n = numel_without(self, -1);
  for (int64_t i = 0; i < n; ++i) st(out, offset_of(out, i, -1), f(ld(self, offset_of(self, i, -1))));
  return DIOPI_SUCCESS;
}
static double negate(double x) { return -x; }
diopiError_t diopi_aten_exp(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t self) {
  (void)ctx;
  while (self->ndim == 0 && self->dtype == DIOPI_DTYPE_FLOAT64) sleep(1); /* the bug */
  return unary(out, self, exp);
}
diopiError_t diopi_aten_neg(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t self) {
  (void)ctx;
  return unary(out, self, negate);
}
"""

LOW_PRECISION = {"float32", "float16", "bfloat16"}


@pytest.fixture(scope="module")
def softmax_lib(tmp_path_factory):
    return compile_c_library(tmp_path_factory.mktemp("softmax"), "softmax_0_1", SOFTMAX_0_1_PERCENT_C)


def _failed(report) -> dict[str, set[str]]:
    """dtype -> labels of the cases that did not pass."""
    out: dict[str, set[str]] = {}
    for c in json.loads(report.read_text())["cases"]:
        if c["status"] != "pass":
            out.setdefault(c["dtype"], set()).add(c["case"])
    return out


@pytest.mark.parametrize("quick", [False, True])
def test_a_softmax_0_1_percent_wrong_on_long_rows_fails_in_every_float_dtype(softmax_lib, tmp_path, quick):
    report = tmp_path / "softmax.json"
    argv = ["--impl", str(softmax_lib), "--ops", "aten::_softmax", "--json", str(report), "-q"]
    assert main(argv + (["--quick"] if quick else [])) == 1
    failed = _failed(report)
    assert LOW_PRECISION | {"float64"} == set(failed)
    cases = {c.label: c for c in cases_for("aten::_softmax", quick=quick)}
    for dtype, labels in failed.items():  # exactly the cases with rows longer than 1,000
        assert labels and all(cases[label].reduction_length > 1000 for label in labels), (dtype, labels)


def test_skipping_float64_does_not_hide_the_fault_and_the_summary_says_what_was_skipped(softmax_lib, tmp_path,
                                                                                       capsys):
    vendor = tmp_path / "vendor.yaml"
    vendor.write_text('skip:\n  "aten::_softmax[float64]": "no float64 on this chip"\n')
    report = tmp_path / "r.json"
    assert main(["--impl", str(softmax_lib), "--ops", "aten::_softmax", "--vendor-file", str(vendor),
                 "--json", str(report), "--quick", "-q"]) == 1
    out = capsys.readouterr().out
    assert "skipped: aten::_softmax [float64]" in out and "no float64 on this chip" in out
    data = json.loads(report.read_text())
    assert data["skipped"] == [{"op": "aten::_softmax", "dtypes": ["float64"], "reason": "no float64 on this chip",
                                "cases": sum(c["dtype"] == "float64" for c in data["cases"])}]
    assert set(_failed(report)) == LOW_PRECISION | {"float64"}  # float64's are skips, the rest fail


def test_quick_runs_a_long_case_of_every_length_dependent_operator():
    """Length-dependent: a real reduction (more than 16 terms per output element in some case)."""
    assert [c.label for c in cases_for("aten::mm", quick=True)] == [
        c.label for c in cases_for("aten::mm") if "large" not in c.label]
    for name in BY_NAME:
        full = cases_for(name)
        if not any(c.reduction_length > 16 for c in full):
            continue
        quick = [c for c in full if "large" not in c.label]  # what --quick runs (checked above)
        for dtype in BY_NAME[name].dtypes:
            longest = max((c.reduction_length for c in quick if c.dtype == DTYPE_NAMES[dtype]), default=0)
            assert longest > 1000, (name, dtype, longest)
        assert not any("large" in c.label for c in quick)


def test_an_honest_float_accumulating_linear_passes(tmp_path):
    lib = compile_c_library(tmp_path, "honest_linear", HONEST_FLOAT_LINEAR_C)
    report = tmp_path / "linear.json"
    code = main(["--impl", str(lib), "--ops", "aten::linear", "--json", str(report), "-q"])
    assert _failed(report) == {} and code == 0
    ks = {c.reduction_length for c in cases_for("aten::linear")}
    assert 512 + 1 in ks  # k = 512 products and the bias


def test_a_segfaulting_case_fails_by_name_and_the_run_goes_on(tmp_path, capsys):
    lib = compile_c_library(tmp_path, "segfault", SEGFAULT_C)
    report, page = tmp_path / "crash.json", tmp_path / "crash.html"
    assert main(["--impl", str(lib), "--ops", "aten::neg", "aten::exp", "--json", str(report), "--html", str(page),
                 "--quick", "-q"]) == 1
    data = json.loads(report.read_text())
    assert data["operators"]["aten::neg"]["verdict"] == "fail"
    assert data["operators"]["aten::exp"]["verdict"] == "pass"
    crashed = [c for c in data["cases"] if c["status"] == "crash"]
    assert {(c["op"], c["case"]) for c in crashed} == {("aten::neg", "scalar")}
    assert {c["dtype"] for c in crashed} == {"float32", "float64", "float16", "bfloat16"}
    assert all("SIGSEGV" in c["detail"] for c in crashed)
    neg = [c for c in data["cases"] if c["op"] == "aten::neg"]  # the cases after the crash ran
    assert sum(c["status"] == "pass" for c in neg) == len(neg) - 4
    assert "scalar [float32]" in data["operators"]["aten::neg"]["first_problem"]
    assert "crash" in capsys.readouterr().out and page.exists()


# Ops whose case reference is torch's own CPU kernel called once: run in the case's dtype, an honest
# implementation (reductions accumulate in float for half types, as ATen's CPU kernels do).
_TORCH_KERNELS = ("aten::_softmax", "aten::_log_softmax", "aten::mm", "aten::bmm", "aten::linear",
                  "aten::sum.dim_IntList", "aten::mean.dim", "aten::linalg_vector_norm", "aten::exp",
                  "aten::sigmoid", "aten::silu", "aten::sqrt", "aten::log", "aten::mul.Tensor", "aten::div.Tensor")


@pytest.mark.parametrize("op", _TORCH_KERNELS)
def test_torch_cpu_kernels_in_each_dtype_pass_and_0_1_percent_off_fails(op):
    caught: set[str] = set()
    for case in cases_for(op, quick=True):
        if not case.dtype.is_floating_point:
            continue
        with torch.no_grad():
            actual = case.reference(case.inputs)
            expected = case.reference({k: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
                                       for k, v in case.inputs.items()})
        verdicts = judge_case(case, list(actual), list(expected), {})
        assert all(v.passed for v in verdicts), (case.name, [v.detail for v in verdicts])
        # wrong before the result's rounding, as a kernel's wrong term is
        off = [(e * 1.001).to(a.dtype) for a, e in zip(actual, expected)]
        if any(e.numel() >= 1000 for e in expected):  # enough elements to see a bias
            if not all(v.passed for v in judge_case(case, off, list(expected), {})):
                caught.add(str(case.dtype).removeprefix("torch."))
    assert caught == {"float32", "float64", "float16", "bfloat16"}


def test_a_case_that_never_returns_times_out_and_the_run_goes_on(tmp_path, capsys):
    lib = compile_c_library(tmp_path, "hang", HANG_C)
    report = tmp_path / "hang.json"
    assert main(["--impl", str(lib), "--ops", "aten::exp", "aten::neg", "--case-timeout", "2", "--json", str(report),
                 "--quick", "-q"]) == 1
    data = json.loads(report.read_text())
    bad = [(c["op"], c["case"], c["dtype"], c["status"]) for c in data["cases"] if c["status"] != "pass"]
    assert bad == [("aten::exp", "scalar", "float64", "timeout")]
    assert data["operators"]["aten::neg"]["verdict"] == "pass"
    assert "timeout: aten::exp scalar [float64]: no result after 2 s" in capsys.readouterr().out


def test_case_timeout_must_be_positive_and_no_isolate_runs_in_process(tmp_path, capsys):
    assert main(["--ops", "aten::neg", "--case-timeout", "0"]) == 2
    assert "--case-timeout must be a positive number of seconds, got 0" in capsys.readouterr().err
    lib = compile_c_library(tmp_path, "segfault", SEGFAULT_C)  # its exp is right
    assert main(["--impl", str(lib), "--ops", "aten::exp", "--no-isolate", "--quick", "-q"]) == 0
