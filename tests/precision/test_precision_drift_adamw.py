"""An honest pair whose optimizer kernels differ: AdamW fused (one ``_fused_adamw_`` kernel, which
returns nothing) against AdamW foreach (``_foreach_*`` ops) must pass at every step, while a 1e-3
fault planted in one op (the forward mm of layer 1's down projection) is still found at the step it
was planted, whichever step that is. References: plain torch (both AdamW implementations are honest:
their losses agree) and the planted fault's place. HuggingFace LlamaForCausalLM on the CPU."""
from contextlib import nullcontext

import pytest
import torch

from ditorch_precision import Capture, compare_dumps
from ditorch_precision.examples.faults import wrong_kernel
from ditorch_precision.examples.hf_llama import HFLlamaSize, hf_batches, hf_train_step, make_hf_llama

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")
SIZE = HFLlamaSize()
STEPS = 2
DOWN = "LlamaForCausalLM.model.layers.1.mlp.down_proj"


def _run(path, fused: bool, fault_at: int | None = None) -> list[float]:
    model = make_hf_llama(SIZE)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=fused, foreach=None if fused else True)
    losses = []
    with Capture(str(path), bulk=True):
        for step, ids in enumerate(hf_batches(SIZE, STEPS)):
            plant = (wrong_kernel("mm", 1 + 1e-3, inside=model.model.layers[1].mlp.down_proj) if step == fault_at
                     else nullcontext())
            with plant:
                losses.append(hf_train_step(model, opt, ids).item())
    return losses


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("adamw")
    losses = {"foreach": _run(root / "foreach", fused=False), "fused": _run(root / "fused", fused=True)}
    for step in range(STEPS):
        losses[f"fault{step}"] = _run(root / f"fault{step}", fused=True, fault_at=step)
    return root, losses


def test_fused_against_foreach_adamw_passes_at_every_step(runs):
    root, losses = runs
    torch.testing.assert_close(losses["fused"], losses["foreach"], rtol=1e-5, atol=0)  # torch: honest
    report = compare_dumps(str(root / "fused"), str(root / "foreach"))
    assert report.passed, [(r["op"], r["module"], r["step"], r["detail"]) for r in report.failed]
    assert {r["step"] for r in report.ops if r["status"] == "pass"} == set(range(STEPS))
    assert any(r["phase"] == "optimizer" for r in report.regions)  # the optimizer was judged, as a region


@pytest.mark.parametrize("step", range(STEPS))
def test_a_fault_at_any_step_is_still_found_with_fused_adamw(runs, step):
    root, _ = runs
    report = compare_dumps(str(root / f"fault{step}"), str(root / "foreach"))
    fd = report.first_divergence
    assert fd is not None and (fd["op"], fd["module"], fd["phase"], fd["step"]) == ("aten::mm", DOWN, "forward", step)
