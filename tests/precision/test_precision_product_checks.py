"""The elementwise PRODUCT check (ditorch_precision.reductions) on cases where the ranks' local
counts can be fooled: a zero shared by several ranks hiding a wrong zero elsewhere, a NaN input
whose finite result poisons the sum of logarithms, products that land among the subnormals.
The reference is plain torch: the product of the ranks' inputs, computed in their dtype."""
from __future__ import annotations

import torch

from ditorch_precision.reductions import check, check_values, encode, local_stats


def _all_reduce(inputs: list[torch.Tensor], result: torch.Tensor) -> tuple[str, str]:
    """The all-reduce path: each rank measures its own input against the result."""
    return check("PRODUCT", [local_stats("PRODUCT", [x], [result]) for x in inputs], list(range(len(inputs))))


def _by_values(inputs: list[torch.Tensor], result: torch.Tensor) -> tuple[str, str]:
    """The reduce / reduce-scatter path: the holder's result against every rank's exact values."""
    return check_values("PRODUCT", [encode([x]) for x in inputs], encode([result]), list(range(len(inputs))))


def _product(inputs: list[torch.Tensor]) -> torch.Tensor:
    out = inputs[0].clone()
    for x in inputs[1:]:
        out = out * x
    return out


def test_a_wrong_zero_hidden_by_a_zero_several_ranks_share_is_found():
    """Inputs [0, 2, 3] and [0, 5, 7]: the product is [0, 10, 21]. A result [0, 0, 21] is 0 at
    element 1, where no rank's input is; counting each rank's zeros of the result (2: both ranks are
    0 at element 0) covers both zeros of the result, so the count alone passes it."""
    a, b = torch.tensor([0.0, 2.0, 3.0]), torch.tensor([0.0, 5.0, 7.0])
    right = _product([a, b])
    wrong = right.clone()
    wrong[1] = 0.0
    for judge in (_all_reduce, _by_values):
        assert judge([a, b], right)[0] == "pass", judge([a, b], right)
        status, detail = judge([a, b], wrong)
        assert status == "fail" and "element 1" in detail, (judge.__name__, status, detail)


def test_a_wrong_zero_is_found_across_chunk_boundaries_with_three_ranks():
    """200,000 elements (several pieces of CHUNK_ELEMENTS), three ranks, every rank 0 at each 3rd
    element (a zero all of them share); one wrong zero at element 131,074 (a piece's third)."""
    n = 200_000
    base = torch.arange(n, dtype=torch.float64) % 7 + 1
    inputs = [base + r for r in range(3)]
    for x in inputs:
        x[::3] = 0.0
    right = _product(inputs)
    wrong = right.clone()
    wrong[131_074] = 0.0
    assert _all_reduce(inputs, right)[0] == "pass"
    status, detail = _all_reduce(inputs, wrong)
    assert status == "fail" and "element 131074" in detail, detail


def test_a_finite_result_where_an_input_is_nan_fails():
    """A NaN input makes the product NaN (torch and gloo alike): a result that is finite there is
    wrong. Non-zero, its NaN logarithm made the magnitude test pass for every element (a result 5x off
    at element 2 passed with it); zero, another rank's zero there made it look explained."""
    nan = float("nan")
    cases = {  # the other rank's input: the wrong result
        (1.0, 5.0, 7.0): (1.0, 10.0, 105.0),
        (0.0, 5.0, 7.0): (0.0, 10.0, 21.0),
    }
    a = torch.tensor([nan, 2.0, 3.0])
    for other, wrong in cases.items():
        b = torch.tensor(other)
        right = _product([a, b])
        assert torch.isnan(right[0])
        for judge in (_all_reduce, _by_values):
            assert judge([a, b], right)[0] == "pass"
            status, detail = judge([a, b], torch.tensor(wrong))
            assert status == "fail" and "NaN or infinite" in detail, (judge.__name__, wrong, status, detail)


def test_products_among_the_subnormals_pass_and_a_wrong_sign_there_fails():
    """float32 1e-22 x 1.5e-22 x 3 rounds to a subnormal (about 4.6e-44, a few significant bits):
    its relative error is far above float32's eps, which no tolerance of normal numbers allows.
    The product torch computes passes; a subnormal of the wrong sign fails."""
    inputs = [torch.tensor([1e-22, 2.0], dtype=torch.float32), torch.tensor([1.5e-22, 3.0], dtype=torch.float32),
              torch.tensor([3.0, 0.5], dtype=torch.float32)]
    right = _product(inputs)
    assert 0 < abs(float(right[0])) < torch.finfo(torch.float32).tiny
    for judge in (_all_reduce, _by_values):
        assert judge(inputs, right)[0] == "pass", judge(inputs, right)
        wrong = right.clone()
        wrong[0] = -wrong[0]
        assert judge(inputs, wrong)[0] == "fail", judge(inputs, wrong)
