"""The comparison library against hand-computed values, numpy float64 and torch.testing.assert_close
(CPU tensors stand in for device tensors)."""
import math

import numpy as np
import pytest
import torch

from ditorch_precision.metrics import (
    compare_error_ratio,
    compare_tensors,
    compare_trees_ratio,
    default_tolerance,
    error_stats,
    floor_tolerance,
    ulp_distance,
)

# torch.testing.assert_close defaults, written out: the floor of every default tolerance.
ASSERT_CLOSE = {torch.float32: (1.3e-6, 1e-5), torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5),
                torch.float64: (1e-7, 1e-7)}


def test_ulp_distance_matches_numpy_nextafter_float32_and_float16():
    for np_dtype, dtype in ((np.float32, torch.float32), (np.float16, torch.float16)):
        x = np.array([1.0, -3.5, 1e-3, 0.0], dtype=np_dtype)
        y = x.copy()
        for _ in range(7):  # seven representable steps up, counted by numpy
            y = np.nextafter(y, np.array(np.inf, dtype=np_dtype))
        got = ulp_distance(torch.from_numpy(x), torch.from_numpy(y))
        assert got.tolist() == [7, 7, 7, 7]
        assert dtype == torch.from_numpy(x).dtype


def test_ulp_distance_across_zero_and_bfloat16_bits():
    tiny = torch.tensor([-1.0e-45, 1.0e-45])  # the smallest float32 subnormals, one step either side of 0
    assert ulp_distance(tiny[:1], tiny[1:]).tolist() == [2]
    a = torch.tensor([0x3F80], dtype=torch.int16).view(torch.bfloat16)  # 1.0
    b = torch.tensor([0x3F83], dtype=torch.int16).view(torch.bfloat16)
    assert ulp_distance(a, b).tolist() == [3]
    assert ulp_distance(torch.tensor([-0.0]), torch.tensor([0.0])).tolist() == [0]


def test_error_stats_hand_computed():
    a = torch.tensor([1.0, 2.0, 4.0, -1.0], dtype=torch.float64)
    e = torch.tensor([1.0, 2.02, 4.0, -0.999], dtype=torch.float64)
    s = error_stats(a, e)
    rel = [0.0, 0.02 / 2.02, 0.0, 0.001 / 0.999]
    assert s.max_abs == pytest.approx(0.02, rel=1e-9)
    assert s.max_rel == pytest.approx(max(rel), rel=1e-9)
    assert s.mean_rel == pytest.approx(sum(rel) / 4, rel=1e-9)
    assert s.within_0_1pct == 0.5  # 0.001/0.999 is just above 0.1%
    assert s.within_0_5pct == 0.75  # 0.02/2.02 is above 0.5%
    na, ne = a.numpy(), e.numpy()
    assert s.cosine == pytest.approx(float(na @ ne / np.linalg.norm(na) / np.linalg.norm(ne)), abs=1e-15)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_default_tolerances_never_below_assert_close(dtype):
    rtol, atol = ASSERT_CLOSE[dtype]
    assert floor_tolerance(dtype).rtol == rtol and floor_tolerance(dtype).atol == atol
    assert default_tolerance(dtype).rtol >= rtol and default_tolerance(dtype).atol >= atol


def _assert_close_passes(a, e, rtol, atol) -> bool:
    try:
        torch.testing.assert_close(a, e, rtol=rtol, atol=atol, check_dtype=False, equal_nan=True)
        return True
    except AssertionError:
        return False


def test_allclose_rule_agrees_with_assert_close():
    g = torch.Generator().manual_seed(0)
    rtol, atol = 1e-3, 1e-5
    for trial in range(200):
        e = torch.randn(16, generator=g, dtype=torch.float64)
        # perturbations straddling the boundary atol + rtol*|e|
        spread = torch.rand(16, generator=g, dtype=torch.float64) * (0.55 if trial % 2 else 0.4)
        scale = (atol + rtol * e.abs()) * (0.5 + spread)
        a = e + scale * torch.sign(torch.randn(16, generator=g, dtype=torch.float64))
        v = compare_tensors(a, e, rtol=rtol, atol=atol)
        assert v.passed == _assert_close_passes(a, e, rtol, atol)
        assert v.rule == "allclose"


def test_nan_and_inf_positions_must_match():
    e = torch.tensor([1.0, float("nan"), float("inf"), 2.0])
    assert compare_tensors(e.clone(), e).passed
    moved = torch.tensor([float("nan"), 1.0, float("inf"), 2.0])
    v = compare_tensors(moved, e)
    assert not v.passed and v.rule == "nan_inf" and v.stats.nan_mismatch == 2
    sign = torch.tensor([1.0, float("nan"), float("-inf"), 2.0])
    v = compare_tensors(sign, e)
    assert not v.passed and v.rule == "nan_inf" and v.stats.inf_mismatch == 1


def test_integer_bool_and_index_results_are_exact():
    idx = torch.tensor([3, 1, 2])
    assert compare_tensors(idx, idx.clone()).rule == "exact"
    v = compare_tensors(idx, torch.tensor([3, 2, 2]))
    assert not v.passed and v.rule == "exact" and "first at (1,)" in v.detail
    assert not compare_tensors(torch.tensor([True, False]), torch.tensor([True, True])).passed
    values, order = torch.tensor([0.3, 0.1, 0.2]).sort()
    assert compare_tensors(order, torch.tensor([1, 2, 0])).passed


def test_shape_mismatch_is_named():
    v = compare_tensors(torch.zeros(2, 3), torch.zeros(3, 2))
    assert not v.passed and v.rule == "shape" and "(2, 3)" in v.detail


def test_float32_default_tolerance_fails_a_real_error():
    e = torch.linspace(1, 2, 100, dtype=torch.float64)
    assert compare_tensors(e.float(), e).passed  # rounding to float32 alone passes
    bad = e.float() * (1 + 1e-4)
    v = compare_tensors(bad, e)
    assert not v.passed and v.rule == "allclose"


def test_error_ratio_rule_hand_computed():
    fp64 = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    reference = torch.tensor([1.0, 2.0 + 1e-3, 3.0], dtype=torch.float32)  # error 1e-3
    device = torch.tensor([1.0, 2.0, 3.0 - 3e-3], dtype=torch.float32)  # error 3e-3
    floor = torch.finfo(torch.float32).eps * 3.0 / 2
    v2 = compare_error_ratio(device, reference, fp64, k=2)
    v4 = compare_error_ratio(device, reference, fp64, k=4)
    assert v2.rule == v4.rule == "error_ratio"
    expected_ratio = abs(float(torch.tensor(3.0 - 3e-3, dtype=torch.float32)) - 3.0) / abs(
        float(torch.tensor(2.0 + 1e-3, dtype=torch.float32)) - 2.0)
    assert v2.ratio == pytest.approx(expected_ratio, rel=1e-12)
    assert not v2.passed and v4.passed
    assert 3e-3 > 2 * max(1e-3, floor)  # the hand check the k=2 verdict rests on
    exact_ref = compare_error_ratio(fp64.float(), fp64.float(), fp64)
    assert exact_ref.passed and exact_ref.ratio == 0.0


def test_error_ratio_credits_a_lucky_reference_half_an_ulp():
    """A reduction's reference result that lands within a fraction of an ulp does not fail a device
    result 2 ulps off (the gradient-clipping norm under Trainer did); a 1e-4 relative error still fails."""
    fp64 = torch.tensor([0.073], dtype=torch.float64)
    reference = fp64.float()  # within half an ulp
    ulp = float(torch.finfo(torch.float32).eps) * 2.0 ** -4  # the float32 spacing in [1/16, 1/8)
    device = reference + 2 * ulp
    err = abs(float(device.double()) - 0.073)
    assert err > torch.finfo(torch.float32).eps * 0.073  # beyond the old floor of eps x |fp64|
    assert compare_error_ratio(device, reference, fp64).passed
    assert not compare_error_ratio(reference * (1 + 1e-4), reference, fp64).passed


def test_to_dict_is_json_safe():
    import json

    v = compare_tensors(torch.tensor([0.0, 1.0]), torch.tensor([1e-30, 1.0]))
    json.dumps(v.to_dict(), allow_nan=False)
    assert math.isfinite(v.stats.max_rel)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_minus_inf_and_the_lowest_finite_are_one_mask_only_where_a_softmax_agrees(dtype):
    """Plain torch's softmax over the last dimension is the reference for the two encodings of a mask:
    where it gives the same result for both, the comparison passes; where it does not (a row masked
    everywhere), it fails. Values that are no mask encoding fail whatever a softmax would make of
    them: -inf against a computed finite value is an overflow, +inf against the largest one too."""
    low, inf = torch.finfo(dtype).min, float("inf")

    def same_softmax(a, e):
        return torch.equal(torch.softmax(a.double(), -1).isnan(), torch.softmax(e.double(), -1).isnan()) and \
            torch.allclose(torch.softmax(a.double(), -1).nan_to_num(), torch.softmax(e.double(), -1).nan_to_num())

    cases = {  # actual, expected, whether they are the same
        "masked positions in rows with unmasked ones": ([[-inf, 1.0, 2.0], [0.5, -inf, -inf]],
                                                        [[low, 1.0, 2.0], [0.5, low, low]], True),
        "the other way round": ([[low, 1.0]], [[-inf, 1.0]], True),
        "a row masked everywhere": ([[-inf, -inf], [1.0, 2.0]], [[low, low], [1.0, 2.0]], False),
        "a large finite value, not the lowest": ([[-inf, 1.0]], [[low / 4, 1.0]], False),
        "+inf against the largest": ([[inf, 1.0]], [[-low, 1.0]], False),
    }
    for what, (a, e, same) in cases.items():
        a, e = torch.tensor(a, dtype=dtype), torch.tensor(e, dtype=dtype)
        if what not in ("+inf against the largest", "a large finite value, not the lowest"):
            assert same_softmax(a, e) == same, what
        v = compare_tensors(a, e)
        assert v.passed == same, (what, v.detail)
        if same:
            assert v.stats.masked == int(torch.isinf(a).sum() + torch.isinf(e).sum())


def test_a_passing_error_ratio_verdict_carries_the_errors_a_full_one_would():
    """compare's common case: a passing op's row shows max_abs and max_rel against its float64 replay,
    the same values the full statistics (numpy, float64) give, without the rest of them; a failing
    one carries them all. Reference: error_stats of the same tensors."""
    g = torch.Generator().manual_seed(0)
    fp64 = torch.randn(1000, generator=g, dtype=torch.float64)
    fp64[3] = float("inf")
    device = fp64.float()
    device[5] = torch.nextafter(device[5], torch.tensor(10.0))  # one ulp: an honest rounding
    reference = fp64.float()
    v = compare_error_ratio(device, reference, fp64)
    full = error_stats(device, fp64)
    assert v.passed and v.stats is None
    assert v.errors == {"max_abs": full.max_abs, "max_rel": pytest.approx(full.max_rel, rel=1e-12)}
    s = compare_trees_ratio([device], [reference], [fp64]).summary()
    assert s["max_abs"] == full.max_abs and "cosine" not in s
    bad = compare_error_ratio(device * (1 + 1e-3), reference, fp64)
    assert not bad.passed and bad.stats is not None and bad.stats.cosine < 1
    empty = torch.zeros(0)
    assert compare_error_ratio(empty, empty, empty.double()).errors == {"max_abs": 0.0, "max_rel": 0.0}
