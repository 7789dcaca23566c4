"""Equivalent kernels that cannot be replayed (another device's attention kernel against the CPU's) are
compared directly; once the runs' inputs drifted apart (the weights after an honest step), an elementwise
tolerance fails them although the kernel computed what it should. Such a pair is judged against the drift
its own inputs carry. Found by the CUDA-against-CPU compare: CUDA's efficient attention at step 1.

Here the pair is relu (the reference) and clamp_min(., 0) (the run under test), declared equivalent, fed
inputs that differ by 1e-4 (honest drift from upstream); a clamp_min(., 0.5) is a fault that the budget
must not hide. References: the inputs' planted difference and the fault's place."""
from __future__ import annotations

import pytest
import torch

from ditorch_precision import Capture, compare_dumps
from ditorch_precision.align import DEFAULT_EQUIVALENT, Equivalences
from ditorch_precision.diff import CompareOptions

PAIR = ("aten::relu", "aten::clamp_min")


def _run(path, op: str, drift: float, floor: float = 0.0) -> None:
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(64, 32, generator=g), torch.randn(32, 16, generator=g)
    x = x * (1 + drift * torch.randn(64, 32, generator=torch.Generator().manual_seed(1)))
    with Capture(str(path)):
        h = x @ w
        y = torch.relu(h) if op == "relu" else torch.clamp_min(h, floor)
        y.sum()


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("equivalent_drift")
    _run(root / "reference", "relu", 0.0)
    _run(root / "honest", "clamp_min", 1e-4)
    _run(root / "fault", "clamp_min", 1e-4, floor=0.5)
    return root


def _options(rule: str = "auto") -> CompareOptions:
    return CompareOptions(rule=rule, equivalences=Equivalences(DEFAULT_EQUIVALENT + (PAIR,)))


def _pair_row(report) -> dict:
    rows = [r for r in report.ops if r["op"] == "aten::clamp_min"]
    assert len(rows) == 1, [(r["op"], r["status"]) for r in report.ops]
    return rows[0]


def test_an_equivalent_kernel_with_drifted_inputs_passes_within_their_drift(root):
    """Before: the pair failed (allclose: elements outside rtol 1e-5), the first divergence."""
    report = compare_dumps(str(root / "honest"), str(root / "reference"), options=_options())
    row = _pair_row(report)
    assert report.passed, [(r["op"], r["rule"], r["detail"]) for r in report.failed]
    assert row["status"] == "pass" and row["rule"] == "input_drift", row
    assert 1e-5 < row["drift"] < 4e-4, row  # the planted 1e-4, as far as relu lets it through


def test_a_fault_in_an_equivalent_kernel_is_still_found(root):
    report = compare_dumps(str(root / "fault"), str(root / "reference"), options=_options())
    row = _pair_row(report)
    assert row["status"] == "fail" and report.first_divergence["op"] == "aten::clamp_min", row


def test_the_allclose_rule_stays_elementwise(root):
    """--rule allclose asks for the runs' results compared directly: no budget."""
    row = _pair_row(compare_dumps(str(root / "honest"), str(root / "reference"), options=_options("allclose")))
    assert row["status"] == "fail" and row["rule"] == "allclose", row
