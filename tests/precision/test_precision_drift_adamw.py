"""An honest pair whose optimizer kernels differ: AdamW fused (one ``_fused_adamw_`` kernel, which
returns nothing) against AdamW foreach (``_foreach_*`` ops) must pass at every step, while a 1e-3
fault planted in one op (a forward matmul of layer 1's MLP) is still found at the step it was planted,
whichever step that is. HuggingFace LlamaForCausalLM in a full capture, GPT-2 in a stats capture.

GPT-2's stats capture failed at step 1 before: the optimizer's kernels differ, so the step's parameters
(``optimizer::params``) judge it, and the bias of the fused query-key-value projection no longer had the
same mean in both runs. Its key part's gradient cancels to rounding noise (softmax ignores a shift of
every score in a row), which the runs round differently once step 0's updates (a rounding apart) moved
the weights, and Adam divides each gradient by its own running magnitude: the mean moved, the norm did
not. A step's parameters are now judged like the optimizer's own ops: in a step whose gradients already
differ, outputs whose norms agree are drift. References: plain torch (both AdamW implementations are
honest: their losses agree) and the planted fault's place."""
from contextlib import nullcontext

import pytest
import torch

from ditorch_precision import Capture, compare_dumps
from ditorch_precision.examples.faults import wrong_kernel
from ditorch_precision.examples.hf_llama import HFLlamaSize, hf_batches, hf_train_step, make_hf_llama

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")
SIZE = HFLlamaSize()


def _gpt2():
    cfg = transformers.GPT2Config(vocab_size=SIZE.vocab, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(cfg)


# name -> (model, capture options, steps, the planted op, the module it is planted in, that module's path)
CASES = {
    "llama, full": (make_hf_llama, {"bulk": True}, 2, "mm", lambda m: m.model.layers[1].mlp.down_proj,
                    "LlamaForCausalLM.model.layers.1.mlp.down_proj"),
    "gpt2, stats": (_gpt2, {"mode": "stats"}, 4, "addmm", lambda m: m.transformer.h[1].mlp.c_proj,
                    "GPT2LMHeadModel.transformer.h.1.mlp.c_proj"),
}


def _run(path, case: str, fused: bool, fault_at: int | None = None) -> list[float]:
    make, options, steps, op, inside, _ = CASES[case]
    model = make()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=fused, foreach=None if fused else True)
    losses = []
    with Capture(str(path), **options):
        for step, ids in enumerate(hf_batches(SIZE, steps)):
            plant = wrong_kernel(op, 1 + 1e-3, inside=inside(model)) if step == fault_at else nullcontext()
            with plant:
                losses.append(hf_train_step(model, opt, ids).item())
    return losses


@pytest.fixture(scope="module", params=list(CASES))
def runs(request, tmp_path_factory):
    case = request.param
    root = tmp_path_factory.mktemp("adamw")
    losses = {"foreach": _run(root / "foreach", case, fused=False), "fused": _run(root / "fused", case, fused=True)}
    for step in range(CASES[case][2]):
        losses[f"fault{step}"] = _run(root / f"fault{step}", case, fused=True, fault_at=step)
    return case, root, losses


def test_fused_against_foreach_adamw_passes_at_every_step(runs):
    case, root, losses = runs
    steps = CASES[case][2]
    torch.testing.assert_close(losses["fused"], losses["foreach"], rtol=1e-5, atol=0)  # torch: honest
    report = compare_dumps(str(root / "fused"), str(root / "foreach"))
    assert report.passed, [(r["op"], r["module"], r["step"], r["detail"]) for r in report.failed]
    assert set(range(steps)) <= {r["step"] for r in report.ops if r["status"] == "pass"}
    assert any(r["phase"] == "optimizer" for r in report.regions)  # the optimizer was judged, as a region
    if "stats" in case:  # step 0's gradients are the same numbers in both runs: its parameters are judged
        params = [r for r in report.ops if r["op"] == "optimizer::params"]
        assert [r["step"] for r in params] == list(range(steps))
        assert params[0]["status"] == "pass" and any(r["status"] == "drift" for r in params[1:]), params


def test_a_fault_at_any_step_is_still_found_with_fused_adamw(runs):
    case, root, losses = runs
    _, _, steps, _, _, path = CASES[case]
    for step in range(steps):
        assert losses[f"fault{step}"][step] != losses["fused"][step]  # the fault took effect at its step
        fd = compare_dumps(str(root / f"fault{step}"), str(root / "foreach")).first_divergence
        assert fd is not None and (fd["op"], fd["module"], fd["phase"], fd["step"]) == (
            f"aten::{CASES[case][3]}", path, "forward", step), (step, fd)
