"""A stats capture through the C++ observer reads a tensor's elements once while it is unchanged: the
parameters after an optimizer step ("optimizer::params") take the statistics the step's last
in-place write left on each of them (the observer's elements_read counts what its statistics pass
reads), and those statistics are float64 torch's over the parameters."""
import pytest
import torch

from ditorch_precision import Capture, native
from ditorch_precision.dump import Dump

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.skipif(not native.available(), reason=f"C++ module not built: {native.why_not()}")]


def test_the_parameters_after_a_step_are_not_read_again(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 32)
    # foreach off: one add_ per parameter, the last write of each
    opt = torch.optim.SGD(model.parameters(), lr=0.1, foreach=False)
    with Capture(str(tmp_path / "cap"), mode="stats", hook="cpp") as cap:
        model(torch.randn(8, 64)).square().sum().backward()
        observer = cap._native.observer
        before = observer.elements_read()
        opt.step()
        read = observer.elements_read() - before
    params = [p.detach().double() for p in model.parameters()]
    # each parameter's add_ output read once; the record after the step reads nothing again
    assert read == sum(p.numel() for p in params)
    (rec,) = [r for r in Dump.open(str(tmp_path / "cap")).records if r["op"] == "optimizer::params"]
    assert len(rec["stats"]) == len(params)
    for s, x in zip(rec["stats"], params):
        assert (s["min"], s["max"], s["numel"]) == (float(x.min()), float(x.max()), x.numel())
        assert s["mean"] == pytest.approx(float(x.mean()), rel=1e-12, abs=1e-15)
        assert s["norm"] == pytest.approx(float(x.norm()), rel=1e-12)


class _WritesThroughData(torch.optim.Optimizer):
    """A plain SGD step (one add_ per parameter), then a write through ``.data`` (another tensor over the same
    storage, whose version counter is its own: the parameter's does not move), as hand-written optimizers
    and EMA updates do."""

    def __init__(self, params, lr: float) -> None:
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                p.add_(p.grad, alpha=-group["lr"])
                p.data.mul_(0.5)


def test_a_write_through_data_after_the_last_in_place_write_is_not_hidden(tmp_path):
    """Before: "optimizer::params" took the statistics of each parameter's add_ from the SGD step (its version
    counter unchanged since), not its values after the later write through .data: every statistic off by 2x."""
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 32)
    opt = _WritesThroughData(model.parameters(), lr=0.1)
    with Capture(str(tmp_path / "cap"), mode="stats", hook="cpp"):
        model(torch.randn(8, 64)).square().sum().backward()
        opt.step()
    params = [p.detach().double() for p in model.parameters()]
    (rec,) = [r for r in Dump.open(str(tmp_path / "cap")).records if r["op"] == "optimizer::params"]
    for s, x in zip(rec["stats"], params):
        assert (s["min"], s["max"]) == (float(x.min()), float(x.max()))
        assert s["norm"] == pytest.approx(float(x.norm()), rel=1e-12)
