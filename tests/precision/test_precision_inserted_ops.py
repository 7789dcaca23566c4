"""Ops the run under test inserts where the reference runs nothing and no module record judges: a loss
scaled by 0.5 before backward (a wrong gradient-accumulation divisor), or gradients clipped in one run
only. Every later op replays exactly from its own inputs and outside a region the runs are not compared
directly, so before, the compare passed ("no divergence") although the gradients differ 2x. An
insertion that hands on what it was given (a copy, a multiplication by one) stays honest. References:
plain torch (the gradients differ or agree) and the planted change's place."""
import pytest
import torch

from ditorch_precision import Capture, compare_dumps
from ditorch_precision.examples.hf_llama import HFLlamaSize, hf_batches, make_hf_llama

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")
SIZE = HFLlamaSize()


def _run(path, inserted=lambda loss: loss, clip: float | None = None, mode: str = "full") -> torch.Tensor:
    model = make_hf_llama(SIZE)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = hf_batches(SIZE, 1)[0]
    with Capture(str(path), mode=mode):
        loss = model(input_ids=ids, labels=ids).loss
        inserted(loss).backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        grad = model.lm_head.weight.grad.clone()
        opt.step()
    return grad


@pytest.mark.parametrize("mode", ["full", "stats"])
def test_a_loss_scaled_in_one_run_only_is_found_where_it_is_scaled(tmp_path, mode):
    grad_a, grad_b = _run(tmp_path / "a", lambda loss: loss * 0.5, mode=mode), _run(tmp_path / "b", mode=mode)
    torch.testing.assert_close(grad_a * 2, grad_b)  # plain torch: half the gradients
    report = compare_dumps(str(tmp_path / "a"), str(tmp_path / "b"))
    assert not report.passed
    fd = report.first_divergence
    assert (fd["op"], fd["module"], fd["phase"], fd["step"], fd["rule"]) == (
        "aten::mul", None, "forward", 0, "inserted_op")
    assert "0.5" in fd["detail"] and "reference runs nothing" in fd["detail"]


def test_gradients_clipped_in_one_run_only_are_found(tmp_path):
    grad_a, grad_b = _run(tmp_path / "a", clip=1e-2), _run(tmp_path / "b")
    assert not torch.allclose(grad_a, grad_b)  # plain torch: the clip is active
    report = compare_dumps(str(tmp_path / "a"), str(tmp_path / "b"))
    assert not report.passed
    fd = report.first_divergence
    assert fd["rule"] == "inserted_op" and fd["module"] is None and fd["step"] == 0


def test_an_insertion_that_hands_on_its_input_is_honest(tmp_path):
    grad_a, grad_b = _run(tmp_path / "a", lambda loss: (loss * 1.0).clone()), _run(tmp_path / "b")
    torch.testing.assert_close(grad_a, grad_b, rtol=0, atol=0)
    report = compare_dumps(str(tmp_path / "a"), str(tmp_path / "b"))
    assert report.passed, [(r["op"], r["module"], r["detail"]) for r in report.failed]
    assert {r["op"] for r in report.unmatched} >= {"aten::mul", "aten::clone"}


def test_a_scaling_only_the_reference_makes_is_found(tmp_path):
    """The mirror case: the reference scales its loss by 0.5 and the run under test does not (before: the
    region 'could not be judged', with no op named)."""
    grad_a, grad_b = _run(tmp_path / "a"), _run(tmp_path / "b", lambda loss: loss * 0.5)
    torch.testing.assert_close(grad_a, grad_b * 2)
    report = compare_dumps(str(tmp_path / "a"), str(tmp_path / "b"))
    assert not report.passed
    fd = report.first_divergence
    assert (fd["op"], fd["module"], fd["phase"], fd["rule"], fd["run"]) == (
        "aten::mul", None, "forward", "inserted_op", "B")
    assert "0.5" in fd["detail"]
