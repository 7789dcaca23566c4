"""Adam divides each element's step by its gradient's root mean square, so an element whose gradient
is near ``eps`` turns another rounding of that gradient into a visibly different step: an honest pair
whose gradients differ by rounding (sdpa against eager attention, AdamW foreach against its loop, lr
1e-2) differs after step 0 in a few parameter elements, far beyond the drift its gradients carry (the
CUDA-vs-CPU compare of an HF LLaMA failed the same way). A compare judges such a step by replaying it
with torch's own AdamW from each run's own inputs: the honest pair passes at every step, an optimizer
that applies twice the weight decay fails at the step it does, a changed learning rate fails as an
argument, and a 1e-3 fault in one op is still found. References: plain torch (the honest runs' losses),
the planted faults' places. HuggingFace LlamaForCausalLM on the CPU."""
import json
import os
import shutil
import subprocess
import sys
from contextlib import contextmanager, nullcontext

import pytest
import torch

from ditorch_precision import Capture, compare_dumps
from ditorch_precision.dump import Dump, DumpError
from ditorch_precision.examples.faults import wrong_kernel
from ditorch_precision.examples.hf_llama import HFLlamaSize, hf_batches, hf_train_step, make_hf_llama
from ditorch_precision.optimizer_replay import FILE, NotReplayable, describe, replay

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")
SIZE = HFLlamaSize()
STEPS = 2
LR, WD = 1e-2, 1e-2
DOWN = "LlamaForCausalLM.model.layers.1.mlp.down_proj"


@contextmanager
def doubled_weight_decay():
    """AdamW's foreach step multiplying the parameters by 1 - 2 lr wd instead of 1 - lr wd (a
    device's optimizer kernel computing something else; each of its ops is right for its arguments)."""
    real = torch._foreach_mul_

    def mul_(tensors, scalar):
        if isinstance(scalar, float) and abs(scalar - (1 - LR * WD)) < 1e-12:
            scalar = 1 - 2 * LR * WD
        return real(tensors, scalar)

    torch._foreach_mul_ = mul_
    try:
        yield
    finally:
        torch._foreach_mul_ = real


def _run(path, attn: str, foreach: bool, hook: str = "auto", lr: float = LR, fault: str | None = None,
         at: int = 1) -> list[float]:
    model = make_hf_llama(SIZE, attn)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=WD, foreach=foreach)
    losses = []
    with Capture(str(path), hook=hook):
        for step, ids in enumerate(hf_batches(SIZE, STEPS)):
            plant = nullcontext()
            if step == at and fault == "weight_decay":
                plant = doubled_weight_decay()
            elif step == at and fault == "mm":
                plant = wrong_kernel("mm", 1 + 1e-3, inside=model.model.layers[1].mlp.down_proj)
            with plant:
                losses.append(hf_train_step(model, opt, ids).item())
    return losses


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("optimizer_replay")
    losses = {"eager": _run(root / "eager", "eager", foreach=False),
              "sdpa": _run(root / "sdpa", "sdpa", foreach=True),
              "sdpa_python": _run(root / "sdpa_python", "sdpa", foreach=True, hook="python"),
              "weight_decay": _run(root / "weight_decay", "sdpa", foreach=True, fault="weight_decay"),
              "lr": _run(root / "lr", "sdpa", foreach=True, lr=LR * 1.01),
              "mm": _run(root / "mm", "sdpa", foreach=True, fault="mm")}
    return root, losses


def _params_rows(report) -> list[dict]:
    return sorted((r for r in report.ops if r["op"] == "optimizer::params"), key=lambda r: r["step"])


@pytest.mark.parametrize("run", ["sdpa", "sdpa_python"])
def test_an_honest_pair_whose_adam_steps_differ_elementwise_passes_by_replay(runs, run):
    root, losses = runs
    torch.testing.assert_close(losses[run], losses["eager"], rtol=1e-4, atol=0)  # torch: honest
    report = compare_dumps(str(root / run), str(root / "eager"))
    assert report.passed, [(r["op"], r["module"], r["step"], r["detail"]) for r in report.failed]
    rows = _params_rows(report)
    judged = [(r["step"], r["status"], r["rule"]) for r in rows]
    assert judged == [(s, "pass", "optimizer_replay") for s in range(STEPS)]
    # each step's parameters differ elementwise (Adam's near-eps elements): what the replay judged
    assert all("directly: " in r["detail"] and "elements outside" in r["detail"] for r in rows), rows


def test_an_optimizer_that_computes_another_step_fails_at_that_step(runs):
    root, _ = runs
    report = compare_dumps(str(root / "weight_decay"), str(root / "eager"))
    fd = report.first_divergence
    assert fd is not None and (fd["op"], fd["step"], fd["rule"]) == ("optimizer::params", 1, "optimizer_replay"), fd
    assert "replay" in fd["detail"]
    step0 = _params_rows(report)[0]
    assert (step0["status"], step0["rule"]) == ("pass", "optimizer_replay")


def test_a_changed_learning_rate_fails_as_an_argument_naming_both_values(runs):
    root, _ = runs
    fd = compare_dumps(str(root / "lr"), str(root / "eager")).first_divergence
    assert fd is not None and (fd["op"], fd["step"], fd["rule"]) == ("optimizer::params", 0, "arguments"), fd
    assert f"optimizer option lr: {LR * 1.01!r} in A, {LR!r} in B" in fd["detail"]


def test_a_changed_learning_rate_fails_stats_and_checksum_captures_too(tmp_path):
    for mode in ("stats", "checksum"):
        paths = []
        for lr in (LR, LR * 1.01):
            model = make_hf_llama(SIZE)
            opt = torch.optim.AdamW(model.parameters(), lr=lr)
            paths.append(str(tmp_path / f"{mode}-{lr}"))
            with Capture(paths[-1], mode=mode):
                hf_train_step(model, opt, hf_batches(SIZE, 1)[0])
        # ranked where the step starts: before its ops' arguments that the option changed (mul_ by 1 - lr wd)
        report = compare_dumps(paths[1], paths[0])
        fd = report.first_divergence
        assert fd is not None and (fd["op"], fd["step"], fd["rule"]) == ("optimizer::params", 0, "arguments"), fd
        assert f"optimizer option lr: {LR * 1.01!r} in A, {LR!r} in B" in fd["detail"]
        assert any(r["op"] == "aten::mul_" and r["rule"] == "arguments" for r in report.failed[1:])


def test_a_fault_in_one_op_is_still_found_at_its_step(runs):
    root, _ = runs
    fd = compare_dumps(str(root / "mm"), str(root / "eager")).first_divergence
    assert fd is not None and (fd["op"], fd["module"], fd["phase"], fd["step"]) == ("aten::mm", DOWN, "forward", 1), fd


def test_the_replay_equals_torchs_own_step_in_float64():
    """describe + replay against an AdamW step run by hand on float64 copies (after one step, so the
    state is replayed too)."""
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(5, 3)), torch.nn.Parameter(torch.randn(4))]
    opt = torch.optim.AdamW([{"params": params[:1]}, {"params": params[1:], "lr": 3e-2}], lr=1e-2, foreach=True)
    for p in params:
        p.grad = torch.randn_like(p)
    opt.step()
    for p in params:
        p.grad = torch.randn_like(p)
    desc, tensors = describe(opt)
    copies = [p.detach().double().clone().requires_grad_() for p in params]
    ref = torch.optim.AdamW([{"params": copies[:1]}, {"params": copies[1:], "lr": 3e-2}], lr=1e-2, foreach=False)
    for c, p in zip(copies, params):
        c.grad = p.grad.double()
        ref.state[c] = {k: v.double() if k != "step" else v.clone() for k, v in opt.state[p].items()}
    ref.step()
    got = list(replay(json.loads(json.dumps(desc)), [t.clone() for t in tensors]))  # a parameter at a time
    assert len(got) == len(copies)
    for g, c in zip(got, copies):
        torch.testing.assert_close(g, c.detach(), rtol=0, atol=0)


class MyAdamW(torch.optim.AdamW):
    pass


def test_only_torchs_own_optimizers_are_replayed(tmp_path):
    p = torch.nn.Parameter(torch.ones(3))
    p.grad = torch.ones(3)
    desc, tensors = describe(MyAdamW([p]))
    with pytest.raises(NotReplayable, match="not one of torch.optim's own"):
        replay(desc, tensors)
    # a capture describes such a step (its options are still compared) but keeps none of its tensors
    lin = torch.nn.Linear(3, 2)
    opt = MyAdamW(lin.parameters())
    with Capture(str(tmp_path / "mine")):
        lin(torch.ones(4, 3)).sum().backward()
        opt.step()
    assert not any(r["op"] == "optimizer::inputs" for r in Dump.open(str(tmp_path / "mine")).records)
    assert json.loads((tmp_path / "mine" / FILE).read_text())["optimizer"].endswith(".MyAdamW")
    desc, tensors = describe(torch.optim.LBFGS([p]))  # it evaluates the loss again: no step of its own
    with pytest.raises(NotReplayable, match="LBFGS does not step each parameter on its own"):
        replay(desc, tensors)
    desc, tensors = describe(torch.optim.AdamW([p]))
    with pytest.raises(NotReplayable, match="holds 1 tensors, its description 2"):
        replay(desc, tensors[:1])


def test_a_reference_without_step_descriptions_is_said_not_passed_over(runs, tmp_path):
    """A reference captured before optimizer steps were described (no optimizer_steps.jsonl): the compare
    says so first, and the step whose parameters differ says why it was not replayed (then the drift budget
    judges it, as before the replay)."""
    old = tmp_path / "eager"
    shutil.copytree(runs[0] / "eager", old)
    (old / FILE).unlink()
    report = compare_dumps(str(runs[0] / "sdpa"), str(old))
    assert any(n.startswith(f"only A describes its optimizer steps ({FILE}") for n in report.notes), report.notes
    rows = _params_rows(report)
    assert rows and all("the step is not replayed: B did not describe it" in r["detail"] for r in rows), rows


def test_a_tampered_step_description_is_refused_naming_the_line(runs, tmp_path):
    root, _ = runs
    bad = tmp_path / "sdpa"
    shutil.copytree(root / "sdpa", bad)
    lines = (bad / FILE).read_text().splitlines()
    desc = json.loads(lines[0])
    desc["groups"][0]["n_params"] += 1  # claims a parameter it does not describe
    (bad / FILE).write_text("\n".join([json.dumps(desc)] + lines[1:]) + "\n")
    with pytest.raises(DumpError, match=f"{FILE}:1: the groups hold 22 parameters, 'params' describes 21"):
        compare_dumps(str(bad), str(root / "eager"))
    cli = subprocess.run([sys.executable, "-m", "ditorch_precision", "compare", str(bad), str(root / "eager")],
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert cli.returncode == 2 and "the groups hold 22 parameters" in cli.stderr and "Traceback" not in cli.stderr
