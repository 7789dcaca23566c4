"""An honest pair whose storage precision differs by design: a HF LlamaForCausalLM run under bf16
autocast (float32 weights and residual stream, matmuls in bfloat16) against the same model cast to
bfloat16. Without a declared policy the compare must fail (float32 against bfloat16 is a changed
argument); with ``{"mixed_precision": ["float32", "bfloat16"]}`` in the equivalence table it passes
at every step in both directions, while a 1e-3 fault planted in one float32 op (layer 1's input
RMSNorm ``rsqrt``, which HF computes in float32 in both runs) is still found at the step it was
planted. References: plain transformers (the two runs' losses agree to bf16 rounding) and the
planted fault's place."""
import json
from contextlib import nullcontext

import pytest
import torch

from ditorch_precision import Capture, compare_dumps
from ditorch_precision.align import Equivalences
from ditorch_precision.diff import CompareOptions
from ditorch_precision.examples.faults import wrong_kernel
from ditorch_precision.examples.hf_llama import HFLlamaSize, hf_batches, make_hf_llama

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")
SIZE = HFLlamaSize()
STEPS = 2
NORM = "LlamaForCausalLM.model.layers.1.input_layernorm"


def _run(path, autocast: bool, fault_at: int | None = None, mode: str = "full", fault: float = 1e-3,
         lr: float = 1e-3, steps: int = STEPS) -> list[float]:
    model = make_hf_llama(SIZE)
    if not autocast:
        model = model.to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    with Capture(str(path), mode=mode, bulk=True):
        for step, ids in enumerate(hf_batches(SIZE, steps)):
            plant = (wrong_kernel("rsqrt", 1 + fault, dtype=torch.float32, inside=model.model.layers[1].input_layernorm)
                     if step == fault_at else nullcontext())
            opt.zero_grad(set_to_none=True)
            with plant, (torch.autocast("cpu", dtype=torch.bfloat16) if autocast else nullcontext()):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return losses


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("amp")
    losses = {"autocast": _run(root / "autocast", True), "bf16": _run(root / "bf16", False)}
    for step in range(STEPS):
        losses[f"fault{step}"] = _run(root / f"fault{step}", False, fault_at=step)
    policy = root / "policy.json"
    policy.write_text(json.dumps({"mixed_precision": ["float32", "bfloat16"]}))
    return root, losses, CompareOptions(equivalences=Equivalences.load(str(policy)))


def test_without_a_policy_the_dtypes_differ(runs):
    root, _, _ = runs
    report = compare_dumps(str(root / "bf16"), str(root / "autocast"))
    assert not report.passed and report.first_divergence["rule"] == "arguments"


@pytest.mark.parametrize("a,b", [("bf16", "autocast"), ("autocast", "bf16")])
def test_autocast_against_a_bf16_model_passes_at_every_step_under_the_policy(runs, a, b):
    root, losses, opts = runs
    torch.testing.assert_close(losses["bf16"], losses["autocast"], rtol=2e-3, atol=0)  # transformers: honest
    report = compare_dumps(str(root / a), str(root / b), options=opts)
    assert report.passed, [(r["op"], r["module"], r["step"], r["detail"]) for r in report.failed[:5]]
    assert {r["step"] for r in report.ops if r["status"] == "pass"} == set(range(STEPS))
    casts = [r for r in report.ops if r["rule"] != "skipped" and "mixed-precision policy" in r["detail"]]
    assert casts  # the casts autocast inserts are judged (against their own float64 replay), not dropped


@pytest.mark.parametrize("step", range(STEPS))
def test_a_fault_at_any_step_is_still_found_under_the_policy(runs, step):
    root, _, opts = runs
    report = compare_dumps(str(root / f"fault{step}"), str(root / "autocast"), options=opts)
    fd = report.first_divergence
    assert fd is not None and (fd["op"], fd["module"], fd["phase"], fd["step"]) == ("aten::rsqrt", NORM, "forward",
                                                                                   step)


@pytest.fixture(scope="module")
def stats_runs(runs):
    """Stats captures of the same pair, and of a fault a stats capture can see under the policy: with no
    tensors to replay, values that carry bfloat16's rounding in one run are judged at K (4) of its roundings,
    each statistic within that of (its value + the typical magnitude): 1e-3 is far below, 25% above."""
    root, _, opts = runs
    for name, autocast in (("autocast", True), ("bf16", False)):
        _run(root / f"stats_{name}", autocast, mode="stats")
    _run(root / "stats_fault", False, fault_at=STEPS - 1, mode="stats", fault=0.25)
    return root, opts


@pytest.mark.parametrize("a,b", [("bf16", "autocast"), ("autocast", "bf16")])
def test_stats_captures_of_autocast_against_a_bf16_model_pass_under_the_policy(stats_runs, a, b):
    """Before: 100 (bf16 against autocast) and 411 (the other way) failures at float32's rtol, from step 0."""
    root, opts = stats_runs
    report = compare_dumps(str(root / f"stats_{a}"), str(root / f"stats_{b}"), options=opts)
    assert report.passed, [(r["op"], r["module"], r["step"], r["detail"]) for r in report.failed[:5]]
    assert {r["step"] for r in report.ops if r["status"] == "pass" and r["rule"] == "stats"} >= set(range(STEPS))
    assert not compare_dumps(str(root / f"stats_{a}"), str(root / f"stats_{b}")).passed  # no policy: dtypes differ


def test_stats_captures_pass_over_five_steps_at_lr_1e_2(tmp_path):
    """Once the weights drift apart, RMSNorm's backward expands a row's sum over the hidden size: each
    difference 32 times over, which the sums' estimate of its drift takes for 32 differences of either sign
    (1.24 where the op it expands carries 0.22); an op judged itself counts that estimate only up to
    OWN_ESTIMATE_CAP x its statistics' own ratio (0.017 here)."""
    for name, autocast in (("autocast", True), ("bf16", False)):
        _run(tmp_path / name, autocast, mode="stats", lr=1e-2, steps=5)
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"mixed_precision": ["float32", "bfloat16"]}))
    opts = CompareOptions(equivalences=Equivalences.load(str(policy)))
    for a, b in (("bf16", "autocast"), ("autocast", "bf16")):
        report = compare_dumps(str(tmp_path / a), str(tmp_path / b), options=opts)
        assert report.passed, [(r["op"], r["module"], r["step"], r["detail"]) for r in report.failed[:5]]


def test_a_fault_a_stats_capture_can_see_is_found_under_the_policy(stats_runs):
    root, opts = stats_runs
    report = compare_dumps(str(root / "stats_fault"), str(root / "stats_autocast"), options=opts)
    fd = report.first_divergence
    assert fd is not None and (fd["op"], fd["module"], fd["phase"], fd["step"]) == (
        "aten::rsqrt", NORM, "forward", STEPS - 1), fd


def test_a_policy_naming_no_dtype_is_refused(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"mixed_precision": ["float32", "bfloat17"]}))
    with pytest.raises(ValueError, match="bfloat17.*float16"):
        Equivalences.load(str(bad))
