"""Inside a module whose op sequences differ between the runs, ops that only look alike are not judged as a pair.

GPT-2's eager attention backward and its sdpa backward share a few views of the same shape; the structural
alignment paired sdpa's view of the output gradient with one of eager's views of the attention weights'
gradient, and a stats capture (compared directly, no replay from each run's own inputs) failed on it at
step 0 although the two implementations are honest. References: transformers itself (both attention
implementations are honest: their losses agree to rtol 1e-5) and the planted fault's place (in a LLaMA, whose
linear layers run `aten::mm`)."""
from contextlib import nullcontext

import pytest
import torch

from ditorch_precision import Capture, compare_dumps
from ditorch_precision.examples.faults import wrong_kernel
from ditorch_precision.examples.hf_llama import HFLlamaSize, hf_batches, hf_train_step, make_hf_llama

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")
STEPS = 3


def _gpt2(attn: str):
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=64, attn_implementation=attn,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    return GPT2LMHeadModel(cfg)


def _gpt2_run(path, attn: str) -> list[float]:
    model = _gpt2(attn)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    losses = []
    with Capture(str(path), mode="stats"):
        for _ in range(STEPS):  # the LLaMA example's step: GPT-2 takes the same input_ids and labels
            losses.append(hf_train_step(model, opt, torch.randint(0, 64, (2, 8), generator=g)).item())
    return losses


def _llama_run(path, attn: str, fault_at: int | None = None, fault: str = "mm") -> None:
    model = make_hf_llama(HFLlamaSize(), attn)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)  # CPU tensors: the for-loop step, which runs aten::sqrt
    with Capture(str(path), mode="stats"):
        for step, ids in enumerate(hf_batches(HFLlamaSize(), STEPS)):
            plant = nullcontext()
            if step == fault_at and fault == "mm":
                plant = wrong_kernel("mm", 1 + 1e-3, inside=model.model.layers[1].mlp.down_proj)
            elif step == fault_at:  # the optimizer's kernel (only its step runs aten::sqrt in this model)
                plant = wrong_kernel(fault, 1 + 1e-3)
            with plant:
                hf_train_step(model, opt, ids)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpt2")
    losses = {"eager": _gpt2_run(root / "eager", "eager"), "sdpa": _gpt2_run(root / "sdpa", "sdpa")}
    _llama_run(root / "llama_eager", "eager")
    _llama_run(root / "llama_fault", "sdpa", fault_at=STEPS - 1)
    _llama_run(root / "llama_eager_adam_fault", "eager", fault_at=1, fault="sqrt")
    _llama_run(root / "llama_sdpa_adam_fault", "sdpa", fault_at=1, fault="sqrt")
    return root, losses


def test_gpt2_sdpa_against_eager_in_stats_captures_passes_at_every_step(runs):
    root, losses = runs
    torch.testing.assert_close(losses["sdpa"], losses["eager"], rtol=1e-5, atol=0)  # transformers: honest
    report = compare_dumps(str(root / "sdpa"), str(root / "eager"))
    assert report.passed, [(r["op"], r["module"], r["step"], r["detail"]) for r in report.failed]
    # the attention's backward differs (sdpa's one kernel against eager's matmuls and softmax): judged as a
    # region by its module records at every step, not skipped
    regions = [r for r in report.regions if r["module"].endswith("h.1.attn") and r["phase"] == "backward"]
    assert sorted(r["step"] for r in regions) == list(range(STEPS)), report.regions


def test_a_fault_after_the_attention_is_still_found(runs):
    root, _ = runs
    report = compare_dumps(str(root / "llama_fault"), str(root / "llama_eager"))
    fd = report.first_divergence
    assert fd is not None and (fd["op"], fd["module"], fd["phase"], fd["step"]) == (
        "aten::mm", "LlamaForCausalLM.model.layers.1.mlp.down_proj", "forward", STEPS - 1), fd
    assert all(r["step"] == STEPS - 1 for r in report.failed), [(r["op"], r["step"]) for r in report.failed]


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_a_fault_in_the_optimizers_kernel_fails_whether_or_not_the_gradients_differ(runs, attn):
    """Adam's denominator 1e-3 off at step 1: with the same attention the gradients are the same numbers; with sdpa
    against eager they differ by rounding, where an optimizer op's statistics that differ are drift if their norms
    agree. Either way the faulty op fails, at its step, as the first divergence."""
    root, _ = runs
    report = compare_dumps(str(root / f"llama_{attn}_adam_fault"), str(root / "llama_eager"))
    fd = report.first_divergence
    assert fd is not None and (fd["op"], fd["phase"], fd["step"], fd["status"]) == (
        "aten::sqrt", "optimizer", 1, "fail"), fd
    assert not [r for r in report.failed if r["step"] == 0], [(r["op"], r["detail"]) for r in report.failed]
