"""Stats captures after the first optimizer step: an honest pair (sdpa against eager attention, GPT-2,
AdamW at lr 1e-2) must pass at every step, while a 1e-3 fault planted in one op is still found at the
step it was planted.

This failed before at step 1: the fused query-key-value projection of layer 1 (``aten::addmm``) had its
minimum 2.2e-5 of itself apart, over float32's rtol of 1e-5. Its key part's bias gets a gradient that
cancels to rounding noise, which the two attention kernels round differently, and Adam turns that noise
into full-sized steps: after step 0 the runs hold other weights, honestly. A stats record has no inputs to
replay the op on (a full capture's rule), so the op is judged against the drift its inputs carry: that of
the parameters it reads, of the ops just before it, of the same op a step before and, in backward, of its
module's forward, each as the statistics estimate it (the sums' difference, at least what they prove).
The references: plain torch (the runs' losses agree), torch's norms of the tensors themselves for the bound
and the estimate the statistics give, and the planted fault's place."""
import math
from contextlib import nullcontext

import pytest
import torch

from ditorch_precision import Capture, compare_dumps
from ditorch_precision.examples.faults import wrong_kernel
from ditorch_precision.examples.hf_llama import HFLlamaSize, hf_batches, hf_train_step
from ditorch_precision.summaries import (difference_estimate, difference_floor, stats_difference, stats_ratio,
                                         tensor_stats)

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")
SIZE = HFLlamaSize()
STEPS = 4
LAYER = "GPT2LMHeadModel.transformer.h.1.attn.c_attn"


def _run(path, attn: str, fault_at: int | None = None, steps: int = STEPS, seed: int = 0, lr: float = 1e-2,
         batches: list[torch.Tensor] | None = None, optim=torch.optim.AdamW, **options) -> list[float]:
    cfg = transformers.GPT2Config(vocab_size=SIZE.vocab, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                  attn_implementation=attn, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                  bos_token_id=0, eos_token_id=0)
    torch.manual_seed(seed)
    model = transformers.GPT2LMHeadModel(cfg)
    opt = optim(model.parameters(), lr=lr, **options)
    losses = []
    with Capture(str(path), mode="stats"):
        for step, ids in enumerate(batches or hf_batches(SIZE, steps)):
            inside = model.transformer.h[1].attn.c_attn
            with wrong_kernel("addmm", 1 + 1e-3, inside=inside) if step == fault_at else nullcontext():
                losses.append(hf_train_step(model, opt, ids).item())
    return losses


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("drift_stats")
    losses = {"eager": _run(root / "eager", "eager"), "sdpa": _run(root / "sdpa", "sdpa")}
    for step in range(1, STEPS):
        _run(root / f"fault{step}", "sdpa", fault_at=step)
    return root, losses


def test_sdpa_against_eager_passes_after_the_weights_drift(runs):
    root, losses = runs
    torch.testing.assert_close(losses["sdpa"], losses["eager"], rtol=1e-4, atol=0)  # torch: honest
    report = compare_dumps(str(root / "sdpa"), str(root / "eager"))
    assert report.passed, [(r["op"], r["module"], r["step"], r["detail"]) for r in report.failed]
    widened = [r for r in report.ops if r["rule"] == "drift_budget"]
    assert widened and {r["step"] for r in widened} <= set(range(1, STEPS)), widened  # never at step 0
    assert any(r["module"] == LAYER and r["op"] == "aten::addmm" for r in widened)


@pytest.mark.parametrize("step", range(1, STEPS))
def test_a_fault_after_the_first_step_is_still_found(runs, step):
    root, _ = runs
    report = compare_dumps(str(root / f"fault{step}"), str(root / "eager"))
    first = report.failed[0]
    assert (first["op"], first["module"], first["step"], first["phase"]) == ("aten::addmm", LAYER, step, "forward")


def test_fused_against_foreach_adamw_passes_over_five_steps(tmp_path):
    """The other honest pair at lr 1e-2: a slice of the attention's key part (``aten::split``) was 5.4e-5 apart
    at step 3 where the ops before it carried 2.6e-6; the same op a step before carries its drift."""
    losses = [_run(tmp_path / name, "sdpa", steps=5, **opts)
              for name, opts in (("fused", {"fused": True}), ("foreach", {"foreach": True}))]
    torch.testing.assert_close(*losses, rtol=1e-4, atol=0)  # torch: honest
    report = compare_dumps(str(tmp_path / "fused"), str(tmp_path / "foreach"))
    assert report.passed, [(r["op"], r["module"], r["step"], r["detail"]) for r in report.failed]
    assert any("the same op a step before" in r["detail"] for r in report.ops if r["rule"] == "drift_budget")


def test_sdpa_against_eager_passes_where_a_gradients_drift_hides_from_its_statistics(tmp_path):
    """Other weights and batches of 2 x 8 tokens, AdamW at lr 1e-3: at step 1 the gradient into layer 0's GELU was
    7.2e-5 apart (||a - b|| / ||b||) while its norm and extremes were within 2e-6, and the product of GELU's
    backward with it showed the whole difference in its maximum (9.2e-5): 9 rows failed while the drift budget
    was built from what statistics prove (a lower bound). The sums' difference estimates the drift itself."""
    gen = torch.Generator().manual_seed(4)
    batches = [torch.randint(0, SIZE.vocab, (2, 8), generator=gen) for _ in range(3)]
    losses = [_run(tmp_path / attn, attn, seed=4, lr=1e-3, batches=batches) for attn in ("sdpa", "eager")]
    torch.testing.assert_close(*losses, rtol=1e-4, atol=0)  # torch: honest
    report = compare_dumps(str(tmp_path / "sdpa"), str(tmp_path / "eager"))
    assert report.passed, [(r["op"], r["module"], r["step"], r["detail"]) for r in report.failed]
    widened = [r for r in report.ops if r["rule"] == "drift_budget"]
    assert widened and {r["step"] for r in widened} <= {1, 2}, widened


def test_rmsprop_passes_where_a_backward_op_reads_what_its_forward_saved(tmp_path):
    """RMSprop at lr 1e-2 (its first steps are ten times lr): at step 3 GELU's backward in layer 1 was 1.06e-3
    apart where the 16 ops before it (the gradient flowing in) carried 1.2e-4; what it multiplies by, the
    forward's activations saved for it, had drifted as far, but 200 ops earlier. 12 rows failed."""
    losses = [_run(tmp_path / attn, attn, optim=torch.optim.RMSprop) for attn in ("sdpa", "eager")]
    torch.testing.assert_close(*losses, rtol=1e-3, atol=0)  # torch: honest
    report = compare_dumps(str(tmp_path / "sdpa"), str(tmp_path / "eager"))
    assert report.passed, [(r["op"], r["module"], r["step"], r["detail"]) for r in report.failed]
    assert any("its module's forward ops" in r["detail"] for r in report.ops if r["rule"] == "drift_budget")


def test_a_steps_parameters_carry_their_drift_a_step_before(tmp_path):
    """Qwen2 (attention biases), fused against foreach AdamW at lr 1e-2: its key projection's bias gets a gradient
    that is rounding noise, Adam's steps on it are whole steps of either sign, and the step's parameters
    (``optimizer::params``) had that bias's mean 1.2e-4 apart at step 2 where no op before them carried more than
    1e-6; the same record a step before carried 1.3e-4."""
    kw = dict(vocab_size=SIZE.vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64)
    gen = torch.Generator().manual_seed(4)
    batches = [torch.randint(0, SIZE.vocab, (2, 8), generator=gen) for _ in range(4)]
    losses = []
    for name in ("fused", "foreach"):
        torch.manual_seed(4)
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**kw))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, **{name: True})
        with Capture(str(tmp_path / name), mode="stats"):
            losses.append([hf_train_step(model, opt, ids).item() for ids in batches])
    torch.testing.assert_close(*losses, rtol=1e-4, atol=0)  # torch: honest
    report = compare_dumps(str(tmp_path / "fused"), str(tmp_path / "foreach"))
    assert report.passed, [(r["op"], r["module"], r["step"], r["detail"]) for r in report.failed]
    assert any(r["op"] == "optimizer::params" and r["rule"] == "drift_budget" for r in report.ops)


def test_the_estimate_of_a_random_sign_difference_is_its_norm_in_the_mean():
    gen = torch.Generator().manual_seed(5)
    b = torch.randn(4096, generator=gen, dtype=torch.float64)
    squares = []
    for _ in range(400):
        delta = torch.randn(4096, generator=gen, dtype=torch.float64) * 1e-4
        sa, sb = tensor_stats(b + delta), tensor_stats(b)
        est, norm = difference_estimate(sa, sb), torch.linalg.vector_norm(delta).item()
        assert est >= difference_floor(sa, sb)
        squares.append((est / norm) ** 2)
    # the sum of n independent differences of either sign: its square has the squared norm for its mean
    assert 0.8 < sum(squares) / len(squares) < 1.25
    # a difference that cancels in the sum (a shift of one element to another) shows its floor only
    shifted = b.clone()
    shifted[0] += 1e-3
    shifted[1] -= 1e-3
    sa, sb = tensor_stats(shifted), tensor_stats(b)
    assert difference_estimate(sa, sb) == difference_floor(sa, sb)
    assert 0 < difference_estimate(sa, sb) <= torch.linalg.vector_norm(shifted - b).item() * (1 + 1e-9)


def test_the_statistics_bound_the_distance_from_below():
    gen = torch.Generator().manual_seed(3)
    for n in (1, 7, 96, 4096):
        b = torch.randn(n, generator=gen, dtype=torch.float64)
        for delta in (torch.randn(n, generator=gen, dtype=torch.float64) * 1e-3,  # everywhere
                      torch.zeros(n, dtype=torch.float64).index_fill_(0, torch.tensor([n // 2]), 0.5),  # one
                      -2 * b):  # sign flips: the same norm
            a = b + delta
            floor = difference_floor(tensor_stats(a), tensor_stats(b))
            assert 0 < floor <= torch.linalg.vector_norm(delta).item() * (1 + 1e-9)  # proven, never more


def test_the_ratio_is_the_least_tolerance_that_passes():
    gen = torch.Generator().manual_seed(4)
    for _ in range(50):
        b = torch.randn(64, generator=gen, dtype=torch.float64)
        a = b * (1 + torch.randn((), generator=gen, dtype=torch.float64) * 1e-4) + 1e-5
        sa, sb = tensor_stats(a), tensor_stats(b)
        ratio = stats_ratio(sa, sb)
        assert stats_difference(sa, sb, ratio * (1 + 1e-9)) is None
        assert stats_difference(sa, sb, ratio * (1 - 1e-6)) is not None
    nan = tensor_stats(torch.tensor([1.0, math.nan]))
    assert stats_ratio(nan, tensor_stats(torch.tensor([1.0, 2.0]))) == math.inf
