"""diopi-conformance: the reference library passes every case; a build with one planted wrong
kernel fails exactly that operator; missing functions are "not implemented"; inputs written by a
kernel are caught; vendor skip/tolerance files; exit codes. References are float64 torch on the CPU."""
from __future__ import annotations

import json

import pytest
import torch
from diopi_testlib import METADATA_C, OMITTED, PLANTED_WRONG, PLANTED_WRONG_ALLOCATING, compile_c_library

from diopi_bindings.conformance.cli import main
from diopi_bindings.conformance.device_memory import RUNTIME_OP
from diopi_bindings.conformance.runner import OUTLIER_SHARE, _judge
from diopi_bindings.schema import BY_NAME


@pytest.mark.slow
def test_reference_library_passes_every_case(reference_path, tmp_path, capsys):
    report = tmp_path / "ref.json"
    assert main(["--impl", str(reference_path), "--json", str(report), "-q"]) == 0
    data = json.loads(report.read_text())
    assert {op: v["verdict"] for op, v in data["operators"].items()} == {op: "pass" for op in [*BY_NAME, RUNTIME_OP]}
    assert len(data["cases"]) > 1000
    labels = " ".join(c["case"] for c in data["cases"])
    for edge in ("empty", "scalar", "broadcast", "non-contiguous", "large"):
        assert edge in labels
    memory_cases = {c["case"] for c in data["cases"] if c["op"] == RUNTIME_OP}
    assert {"round trip", "device 0 -> 1", "out-of-range device refused", "foreign free refused"} <= memory_cases
    for op in BY_NAME.values():  # every declared dtype was exercised
        assert {c["dtype"] for c in data["cases"] if c["op"] == op.aten} == set(op.dtypes)
    assert f"operators: {len(BY_NAME) + 1} pass, 0 fail" in capsys.readouterr().out


def test_planted_wrong_kernels_fail_exactly_those_operators(variant_path, tmp_path):
    report, page = tmp_path / "variant.json", tmp_path / "variant.html"
    assert main(["--impl", str(variant_path), "--json", str(report), "--html", str(page), "--quick", "-q"]) == 1
    data = json.loads(report.read_text())
    assert not any("large" in c["case"] for c in data["cases"])  # --quick
    verdicts = {op: v["verdict"] for op, v in data["operators"].items()}
    expected = {op: "pass" for op in [*BY_NAME, RUNTIME_OP]}
    expected[PLANTED_WRONG] = expected[PLANTED_WRONG_ALLOCATING] = "fail"
    expected.update({op: "not implemented" for op in OMITTED})
    assert verdicts == expected
    assert PLANTED_WRONG in page.read_text() and "not implemented" in page.read_text()


def test_a_wrong_kernel_allocating_its_output_fails_exactly_the_cases_with_a_result(variant_path, tmp_path):
    """nonzero allocates its output through the context (its size depends on the data); the planted kernel
    writes every index off by one, so every case with at least one nonzero element fails and the rest
    (empty, all-zero, a scalar zero) pass. Reference: torch.nonzero on the CPU."""
    report = tmp_path / "nonzero.json"
    assert main(["--impl", str(variant_path), "--ops", PLANTED_WRONG_ALLOCATING, "--json", str(report), "-q"]) == 1
    cases = json.loads(report.read_text())["cases"]
    failed = {(c["dtype"], c["case"]) for c in cases if c["status"] != "pass"}
    from diopi_bindings.conformance.cases import _dtype_name, cases_for

    with_result = {(_dtype_name(c.dtype), c.label) for c in cases_for(PLANTED_WRONG_ALLOCATING)
                   if torch.nonzero(c.inputs["self"]).numel() > 0}
    assert failed == with_result and len(with_result) < len(cases)
    assert all(c["status"] == "fail" for c in cases if (c["dtype"], c["case"]) in failed)


def test_missing_functions_alone_do_not_fail_the_run(variant_path):
    assert main(["--impl", str(variant_path), "--ops", *OMITTED, "aten::mul.Tensor", "-q"]) == 0


def test_a_kernel_that_writes_its_input_fails(tmp_path):
    src = METADATA_C % {"abi": "DIOPI_ABI_VERSION"} + """
diopiError_t diopi_aten_neg(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t self) {
  (void)ctx;
  if (out->dtype != DIOPI_DTYPE_FLOAT64 || out->ndim != 2) return DIOPI_ERR_DTYPE;
  for (int64_t i = 0; i < out->shape[0]; ++i)
    for (int64_t j = 0; j < out->shape[1]; ++j) {
      double* x = (double*)self->data + i * self->strides[0] + j * self->strides[1];
      ((double*)out->data)[i * out->strides[0] + j * out->strides[1]] = -*x;
      *x = 0.0; /* the bug: scribbles on its input */
    }
  return DIOPI_SUCCESS;
}
"""
    lib = compile_c_library(tmp_path, "scribbler", src)
    report = tmp_path / "s.json"
    assert main(["--impl", str(lib), "--ops", "aten::neg", "--json", str(report), "-q"]) == 1
    cases = json.loads(report.read_text())["cases"]
    basic64 = next(c for c in cases if c["dtype"] == "float64" and c["case"] == "basic")
    assert basic64["status"] == "fail" and "modified its input(s) self" in basic64["detail"]
    assert {c["status"] for c in cases if c["dtype"] == "float32"} == {"error"}  # refused dtypes are errors


@pytest.mark.parametrize("outside, off, passed", [(2, 5e-5, True), (3, 5e-5, False), (1, 0.5, False)])
def test_outlier_share_rule(outside, off, passed):
    """At most 0.1% of the elements outside the element bound (float32: 1e-5 relative here), each within
    8 times it: 5e-5 on values near 1 is an outlier allowed twice in 2000, 0.5 never."""
    expected = torch.linspace(1, 2, 2000, dtype=torch.float64)
    actual = expected.float().clone()
    actual[:outside] += off
    assert int(OUTLIER_SHARE * 2000) == 2
    verdict = _judge(actual, expected, {})
    assert verdict.passed is passed
    if passed:
        assert "within the 0.1% rule" in verdict.detail


def test_vendor_file_skips_and_loosens(variant_path, tmp_path):
    skip = tmp_path / "skip.yaml"
    skip.write_text(f'skip:\n  "{PLANTED_WRONG}[float32]": "known"\n  "{PLANTED_WRONG}": "firmware bug 123"\n')
    report = tmp_path / "r.json"
    argv = ["--impl", str(variant_path), "--ops", PLANTED_WRONG, "--vendor-file", str(skip),
            "--json", str(report), "-q"]
    assert main(argv) == 0
    cases = json.loads(report.read_text())["cases"]
    assert {c["status"] for c in cases} == {"skipped"}
    assert {c["detail"] for c in cases if c["dtype"] == "float32"} == {"known"}

    loose = tmp_path / "loose.json"  # the planted error is 1% + 1e-3
    loose.write_text(json.dumps({"tolerance": {PLANTED_WRONG: {"rtol": 0.02, "atol": 0.01}}}))
    assert main(["--impl", str(variant_path), "--ops", PLANTED_WRONG, "--vendor-file", str(loose), "-q"]) == 0
    loose.write_text(json.dumps({"tolerance": {f"{PLANTED_WRONG}[float32]": {"rtol": 0.02, "atol": 0.01}}}))
    assert main(["--impl", str(variant_path), "--ops", PLANTED_WRONG, "--vendor-file", str(loose), "-q"]) == 1


@pytest.mark.parametrize("content, message", [
    ("skip:\n  aten::nope: x\n", "'aten::nope', which is not a DIOPI operator"),
    ("skip:\n  aten::mm[int64]: x\n", "dtype 'int64', which aten::mm does not declare"),
    ("tolerance:\n  aten::mm: {rtol: fast}\n", "must be numbers"),
    ("tolerance:\n  aten::mm: {rtl: 1}\n", "mapping with rtol and/or atol"),
    ("skips: {}\n", "expected a mapping with the keys 'skip' and/or 'tolerance'"),
    ("skip: [unterminated\n", "is not valid YAML"),
])
def test_bad_vendor_file_is_a_usage_error(tmp_path, capsys, content, message):
    bad = tmp_path / "vendor.yaml"
    bad.write_text(content)
    assert main(["--vendor-file", str(bad), "--ops", "aten::mm", "-q"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_bad_arguments_are_usage_errors(tmp_path, capsys):
    assert main(["--impl", str(tmp_path / "absent.so")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["--ops", "aten::matmul"]) == 2
    assert "unknown operator(s) aten::matmul" in capsys.readouterr().err
    assert main(["--vendor-file", str(tmp_path / "none.yaml")]) == 2
    assert "cannot read vendor file" in capsys.readouterr().err
