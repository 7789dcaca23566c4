"""Regions (modules whose op sequences differ between the runs) are never passed unjudged: an
optimizer region (fused AdamW against the foreach one) is judged by the parameters after the step,
a region nothing can judge makes the compare fail, and module records without a partner are listed.
References: plain torch (the parameters a second, unfused AdamW computes) and the planted change."""
import json

import pytest
import torch

from ditorch_precision import Capture, Selector, compare_dumps
from ditorch_precision.cli import main
from ditorch_precision.examples.hf_llama import HFLlamaSize, hf_batches, hf_train_step, make_hf_llama

pytestmark = pytest.mark.usefixtures("one_thread")
SIZE = HFLlamaSize()


def _optimizer_run(path, fused: bool, lr: float = 1e-3):
    pytest.importorskip("transformers")
    model = make_hf_llama(SIZE)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, fused=fused, foreach=None if fused else True)
    with Capture(str(path)):
        hf_train_step(model, opt, hf_batches(SIZE, 1)[0])
    return str(path), [p.detach().clone() for p in model.parameters()]


@pytest.fixture(scope="module")
def optimizer_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("optim")
    return {"foreach": _optimizer_run(root / "foreach", False), "fused": _optimizer_run(root / "fused", True),
            "fused_lr": _optimizer_run(root / "fused_lr", True, lr=1e-3 * (1 + 1e-2))}


def _optimizer_regions(report):
    return [r for r in report.regions if r["phase"] == "optimizer"]


def test_fused_and_foreach_adamw_form_an_optimizer_region_judged_by_the_parameters(optimizer_runs):
    (fused, params_fused), (foreach, params_foreach) = optimizer_runs["fused"], optimizer_runs["foreach"]
    for a, b in zip(params_fused, params_foreach):  # the reference: plain torch agrees both are right
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    report = compare_dumps(fused, foreach)
    regions = _optimizer_regions(report)
    assert len(regions) == 1 and regions[0]["verdict"] == "pass" and regions[0]["n_module_records"] == 1
    assert report.passed
    params = [r for r in report.ops if r["op"] == "optimizer::params"]
    assert len(params) == 1 and params[0]["status"] == "pass"


def test_a_wrong_optimizer_step_fails_its_region(optimizer_runs, capsys):
    """A 1% larger learning rate in the run under test: only the parameters after the step differ."""
    (bad, params_bad), (ref, params_ref) = optimizer_runs["fused_lr"], optimizer_runs["foreach"]
    assert not all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(params_bad, params_ref))
    assert main(["compare", bad, ref, "--json"]) == 1
    d = json.loads(capsys.readouterr().out)
    assert [(r["op"], r["phase"]) for r in d["ops"] if r["status"] == "fail"] == [("optimizer::params", "optimizer")]
    assert [r["verdict"] for r in d["regions"] if r["phase"] == "optimizer"] == ["fail"]


class _Proj(torch.nn.Module):
    def __init__(self, extra_op: bool, twice: bool = False):
        super().__init__()
        self.inner = torch.nn.Linear(4, 4)
        self.extra_op, self.twice = extra_op, twice

    def forward(self, x):
        x = x * 1.0 if self.extra_op else x
        y = self.inner(x)
        return self.inner(y) if self.twice else y


def _small(path, selector=None, **kw):
    torch.manual_seed(0)
    model, x = _Proj(**kw), torch.randn(2, 4)
    with Capture(str(path), selector):
        model(x).sum().backward()
    return str(path)


def test_a_region_nothing_can_judge_does_not_pass(tmp_path, capsys):
    """The run under test runs a kernel only its torch has (gone when the compare runs), the reference
    an op of its own in its place, and the capture has an op filter (no module records): nothing can
    tell whether they agree, so the region is reported unjudged and the compare fails, instead of 'no
    divergence'. (Had the run under test no op there, the reference's `x * 1.0`, which hands on its input,
    would be judged so.)"""
    from ditorch_precision.examples.faults import device_only_kernel

    every_op = Selector.build(ops="*")
    torch.manual_seed(0)
    model, x = _Proj(extra_op=False), torch.randn(2, 4)
    with device_only_kernel() as scale, Capture(str(tmp_path / "a"), every_op):
        model.forward = lambda x: model.inner(scale(x, 1.0))
        model(x).sum().backward()
    a = str(tmp_path / "a")
    b = _small(tmp_path / "b", every_op, extra_op=True)
    report = compare_dumps(a, b)
    assert [(r["module"], r["phase"], r["verdict"]) for r in report.regions] == [("_Proj", "forward", "unjudged")]
    assert not report.passed and report.first_divergence is None
    assert main(["compare", a, b]) == 1
    assert "could not be judged" in capsys.readouterr().out


def test_an_op_of_the_reference_that_hands_on_its_input_passes_where_nothing_else_judges(tmp_path):
    """The reference runs `x * 1.0` where the run under test runs nothing, under an op filter (no module
    records): its output is its input, so the region passes; the same op scaling by 2 fails it."""
    every_op = Selector.build(ops="*")
    a = _small(tmp_path / "a", every_op, extra_op=False)
    report = compare_dumps(a, _small(tmp_path / "b", every_op, extra_op=True))
    assert [(r["module"], r["verdict"]) for r in report.regions] == [("_Proj", "pass")] and report.passed
    torch.manual_seed(0)
    model, x = _Proj(extra_op=False), torch.randn(2, 4)
    with Capture(str(tmp_path / "c"), every_op):
        model.forward = lambda x: model.inner(x * 2.0)
        model(x).sum().backward()
    fd = compare_dumps(a, str(tmp_path / "c")).first_divergence
    assert (fd["op"], fd["rule"], fd["run"]) == ("aten::mul", "inserted_op", "B")


def test_module_records_without_a_partner_are_listed(tmp_path):
    """The run under test calls a module twice, the reference once: the extra call's records are
    reported, not dropped by pairing."""
    a = _small(tmp_path / "a", extra_op=False, twice=True)
    b = _small(tmp_path / "b", extra_op=False)
    report = compare_dumps(a, b)
    lone = [(r["op"], r["module"], r["run"]) for r in report.unmatched if r["op"].startswith("module::")]
    assert ("module::output", "_Proj.inner", "A") in lone and ("module::grad", "_Proj.inner", "A") in lone


def _jittered(path, device_kernel: bool, reference_draws: bool = True):
    """_Proj whose input gets uniform noise in [-5e-4, 5e-4]: in A by a random kernel only the device's
    torch has (gone when the compare runs), in B by torch's own ops (``rand``), or not at all."""
    from ditorch_precision.examples.faults import device_only_random_kernel

    torch.manual_seed(0)
    model, x = _Proj(extra_op=False), torch.randn(2, 4)
    torch.manual_seed(1 if device_kernel else 2)  # other draws, as another device's generator makes
    with device_only_random_kernel() as jitter, Capture(str(path)):
        if device_kernel:
            model.forward = lambda x: model.inner(jitter(x, 1e-3))
        elif reference_draws:
            model.forward = lambda x: model.inner(x + (torch.rand(x.shape) - 0.5) * 1e-3)
        out = model(x)
        out.sum().backward()
    return str(path), out.detach()


def test_a_random_kernel_the_comparing_torch_does_not_know_counts_as_a_draw(tmp_path):
    """The run under test adds noise by a random kernel only its torch has (a vendor's fused kernel),
    the reference by torch's own ops: A's module record differs from B's because of those draws,
    which the capture marked as random, so the region drifts instead of failing (plain torch: the
    outputs differ)."""
    a, out_a = _jittered(tmp_path / "a", device_kernel=True)
    b, out_b = _jittered(tmp_path / "b", device_kernel=False)
    assert not torch.allclose(out_a, out_b, rtol=1e-5, atol=1e-6)
    report = compare_dumps(a, b)
    [drew] = [r for r in report.unmatched if r["op"] == "precision_faults::jitter"]
    assert drew["run"] == "A"
    assert [(r["module"], r["phase"], r["verdict"]) for r in report.regions] == [("_Proj", "forward", "drift")]
    assert [r["status"] for r in report.ops if r["op"] == "module::output"] == ["drift"] * 2  # _Proj.inner, _Proj
    assert report.passed


def test_a_random_kernel_where_the_reference_draws_nothing_is_a_divergence(tmp_path):
    """The same kernel, and the reference adds no noise: draws in one run only are no randomness the runs
    make differently but a difference of what they compute (before: drift, and the compare passed)."""
    a, out_a = _jittered(tmp_path / "a", device_kernel=True)
    b, out_b = _jittered(tmp_path / "b", device_kernel=False, reference_draws=False)
    assert not torch.allclose(out_a, out_b, rtol=1e-5, atol=1e-6)
    report = compare_dumps(a, b)
    fd = report.first_divergence
    assert (fd["op"], fd["module"], fd["rule"]) == ("precision_faults::jitter", "_Proj", "random_draws")
    assert not report.passed
