"""Random draws in one run only are a divergence, not honest randomness: a dropout probability that is
0.1 in one run and 0 in the other (HF LLaMA's ``attention_dropout``) makes one run draw a keep mask
the other never draws. Before, the draws excused every difference after them ("differs after random
draws, which the runs make differently") and the compare passed, although the losses differ. Draws
that both runs make (the same dropout under other seeds) stay honest. References: plain transformers
(the losses differ or agree) and the planted change's place."""
import pytest
import torch

from ditorch_precision import Capture, compare_dumps
from ditorch_precision.examples.hf_llama import HFLlamaSize, hf_batches, hf_train_step, make_hf_llama

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")
SIZE = HFLlamaSize()
ATTN0 = "LlamaForCausalLM.model.layers.0.self_attn"


def _run(path, dropout: float, mode: str = "full", draw_seed: int = 0) -> float:
    model = make_hf_llama(SIZE)
    model.config.attention_dropout = dropout  # read by each attention layer at every forward
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = dropout
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    torch.manual_seed(draw_seed)  # the dropout masks' draws
    with Capture(str(path), mode=mode):
        return hf_train_step(model, opt, hf_batches(SIZE, 1)[0]).item()


@pytest.mark.parametrize("mode", ["full", "stats"])
def test_dropout_in_the_run_under_test_only_is_found_where_it_draws(tmp_path, mode):
    loss_a, loss_b = _run(tmp_path / "a", 0.1, mode), _run(tmp_path / "b", 0.0, mode)
    assert loss_a != loss_b  # plain transformers: the change matters
    report = compare_dumps(str(tmp_path / "a"), str(tmp_path / "b"))
    assert not report.passed
    fd = report.first_divergence
    assert (fd["op"], fd["module"], fd["phase"], fd["step"], fd["rule"]) == (
        "aten::bernoulli_", ATTN0, "forward", 0, "random_draws")
    assert "draws none" in fd["detail"]


def test_dropout_in_the_reference_only_is_found(tmp_path):
    loss_a, loss_b = _run(tmp_path / "a", 0.0), _run(tmp_path / "b", 0.1)
    assert loss_a != loss_b
    report = compare_dumps(str(tmp_path / "a"), str(tmp_path / "b"))
    assert not report.passed
    fd = report.first_divergence
    assert (fd["module"], fd["phase"], fd["step"]) == (ATTN0, "forward", 0)


@pytest.mark.parametrize("mode", ["full", "stats"])
def test_the_same_dropout_under_other_seeds_is_honest(tmp_path, mode):
    loss_a, loss_b = _run(tmp_path / "a", 0.1, mode, draw_seed=1), _run(tmp_path / "b", 0.1, mode, draw_seed=2)
    assert loss_a != loss_b  # other masks
    report = compare_dumps(str(tmp_path / "a"), str(tmp_path / "b"))
    assert report.passed, [(r["op"], r["module"], r["detail"]) for r in report.failed]
