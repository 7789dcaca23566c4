"""diopi-conformance over a library written to DeepLink's DIOPI (functions named diopiSoftmax, diopiRelu, ...
over opaque handles), checked by the same cases, rules and isolation as a library of the project's ABI,
through the native device's DIOPI runtime and routes. The library is deeplink_vendor/vendor.cpp built here
against include/deeplink with no shim: honest (float32/float64; other dtypes declined), and with two planted
faults (softmax 0.1% too large on rows longer than 1,000; relu dereferencing NULL on a 0-dim input).
References: float64 torch on the CPU. Each run is a fresh interpreter (one device and one attached library
per process)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from diopi_testlib import run_python

from diopi_bindings.conformance.cases import cases_for
from diopi_bindings.schema import BY_NAME
from test_diopi_deeplink import build_vendor
from test_diopi_native_device import FULL_CONFORMANCE

OPS = ("aten::_softmax", "aten::relu", "aten::mul.Tensor", "aten::silu")
COMPUTED = {"float32", "float64"}  # what the vendor computes; it declines the other dtypes
DECLINED = {"float16", "bfloat16"}


def conformance(library: Path, report: Path, *extra: str) -> int:
    return run_python(f"""
        import json
        from diopi_bindings.conformance.cli import main
        code = main(["--impl", {str(library)!r}, "--json", {str(report)!r}, "-q", *{list(extra)!r}])
        print(json.dumps({{"code": code}}))
    """)["code"]


def test_a_diopi_named_library_with_a_wrong_softmax_and_a_crashing_relu_fails_by_name(tmp_path: Path) -> None:
    planted = build_vendor(tmp_path, "planted", "-DPLANT_SOFTMAX_LONG_ROWS", "-DPLANT_RELU_SEGFAULT")
    report, page = tmp_path / "planted.json", tmp_path / "planted.html"
    assert conformance(planted, report, "--ops", *OPS, "--quick", "--html", str(page)) == 1
    data = json.loads(report.read_text())
    assert "DIOPI" in data["library"]["version"] and data["library"]["interface"] == "DIOPI"
    ops = data["operators"]
    assert {op: (row["verdict"], row["function"]) for op, row in ops.items()} == {
        "aten::_softmax": ("fail", "diopiSoftmax"), "aten::relu": ("fail", "diopiRelu"),
        "aten::mul.Tensor": ("pass", "diopiMul"), "aten::silu": ("pass", "diopiSilu")}
    cases = data["cases"]
    # the softmax: exactly its cases with rows longer than 1,000, in every dtype it computes
    long_rows = {c.label for c in cases_for("aten::_softmax", quick=True) if c.reduction_length > 1000}
    wrong = {(c["case"], c["dtype"]) for c in cases if c["op"] == "aten::_softmax" and c["status"] == "fail"}
    assert wrong == {(label, dtype) for label in long_rows for dtype in COMPUTED}, wrong
    # the relu: its 0-dim case crashed in each dtype, named with the case and the function, and its other
    # cases ran after the crash and passed
    relu = [c for c in cases if c["op"] == "aten::relu"]
    crashed = {(c["case"], c["dtype"]) for c in relu if c["status"] == "crash"}
    assert crashed == {("scalar", dtype) for dtype in COMPUTED | DECLINED}
    assert all("SIGSEGV" in c["detail"] and "diopiRelu" in c["detail"] for c in relu if c["status"] == "crash")
    assert {c["status"] for c in relu if c["case"] != "scalar" and c["dtype"] in COMPUTED} == {"pass"}
    assert "scalar" in ops["aten::relu"]["first_problem"]
    # what was not judged is said: the dtypes the vendor declined ran on the CPU
    declined = {(g["op"], tuple(sorted(g["dtypes"]))) for g in data["declined"]}
    assert declined == {(op, tuple(sorted(set(BY_NAME[op].dtypes) - COMPUTED))) for op in OPS}
    assert "diopiSoftmax" in page.read_text()


@pytest.fixture(scope="module")
def honest(tmp_path_factory) -> Path:
    return build_vendor(tmp_path_factory.mktemp("honest"), "honest")


def test_the_same_library_without_the_faults_passes(honest: Path, tmp_path: Path) -> None:
    report = tmp_path / "honest.json"
    assert conformance(honest, report, "--ops", *OPS, "aten::gelu", "--quick") == 0
    data = json.loads(report.read_text())
    verdicts = {op: row["verdict"] for op, row in data["operators"].items()}
    assert verdicts == {**{op: "pass" for op in OPS}, "aten::gelu": "skipped"}
    for op in OPS:
        statuses = {(c["dtype"], c["status"]) for c in data["cases"] if c["op"] == op}
        assert statuses == {(d, "pass" if d in COMPUTED else "declined") for d in BY_NAME[op].dtypes}, op
    # gelu has no DIOPI function in the table: skipped, and the summary says why
    assert [g["op"] for g in data["skipped"]] == ["aten::gelu"]
    assert "maps no DIOPI function" in data["skipped"][0]["reason"]


def test_a_diopi_named_library_is_refused_on_host_memory(honest: Path) -> None:
    got = run_python(f"""
        import json
        from diopi_bindings.conformance.cli import main
        print(json.dumps({{"code": main(["--impl", {str(honest)!r}, "--device", "host", "-q"])}}))
    """)
    assert got["code"] == 2 and "DeepLink's DIOPI" in got["_stderr"] and "--device host" in got["_stderr"]


# Operators whose case calls are adapted to their ATen overloads (renamed or derived arguments, in-place or
# functional forms, integer scalars, absent bounds), and a training path's main ones.
ADAPTED = ("aten::max.dim", "aten::embedding_dense_backward", "aten::index_put", "aten::index.Tensor", "aten::clamp",
           "aten::arange.start_step", "aten::fill_.Scalar", "aten::_log_softmax_backward_data", "aten::addmm",
           "aten::cat", "aten::add.Tensor", "aten::nll_loss_forward")


def _reference_report(tmp_path: Path, *ops: str) -> dict:
    from diopi_bindings import deeplink

    report = tmp_path / "reference.json"
    code = conformance(deeplink.reference_path(), report, "--quick", *(("--ops", *ops) if ops else ()))
    data = json.loads(report.read_text())
    assert code == 0, data["summary"]
    return data


def test_the_reference_under_diopi_names_passes_the_adapted_operators(tmp_path: Path) -> None:
    data = _reference_report(tmp_path, *ADAPTED)
    assert {op: row["verdict"] for op, row in data["operators"].items()} == {op: "pass" for op in ADAPTED}
    assert not data["declined"]


# The whole suite under DIOPI names takes minutes on a small machine: make test-diopi-full.
@FULL_CONFORMANCE
def test_the_reference_under_diopi_names_conformance_suite_passes_on_native_device(tmp_path: Path) -> None:
    data = _reference_report(tmp_path)
    verdicts = {row["verdict"] for row in data["operators"].values()}
    assert verdicts == {"pass", "skipped"}, data["summary"]
    assert sum(row["verdict"] == "pass" for row in data["operators"].values()) >= 45
    assert not data["declined"]
