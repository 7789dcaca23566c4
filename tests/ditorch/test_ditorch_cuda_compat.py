"""Opt-in CUDA compatibility: a script written for CUDA runs unchanged on the chosen vendor (the CPU
here, standing in for any accelerator). The reference is the same loop written for plain CPU torch,
run with ditorch switched off."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import ditorch

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="on a CUDA machine compat mode is the identity")

PATCHED_MODULES = {
    "torch": torch, "torch.cuda": torch.cuda, "torch.Tensor": torch.Tensor, "torch._C.TensorBase": torch._C.TensorBase,
    "torch._C._nn": torch._C._nn, "torch.nn.Module": torch.nn.Module,
}


def snapshot() -> dict[str, dict[str, object]]:
    return {name: dict(vars(obj)) for name, obj in PATCHED_MODULES.items()}


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Linear(8, 32), torch.nn.GELU(), torch.nn.Dropout(0.1), torch.nn.Linear(32, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def train_written_for_cuda(steps: int = 6) -> tuple[list[float], dict[str, torch.Tensor]]:
    assert torch.cuda.is_available(), "this loop needs CUDA"
    torch.manual_seed(0)
    torch.cuda.manual_seed_all(0)
    torch.cuda.set_device(0)
    device = torch.device("cuda", torch.cuda.current_device())
    model = Net().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    losses = []
    for _ in range(steps):
        x = torch.randn(16, 8, device="cuda")
        y = torch.randn(16, 1).cuda(non_blocking=True)
        start.record()
        with torch.cuda.stream(torch.cuda.current_stream()):
            loss = F.mse_loss(model(x.to(device)), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        end.record()
        torch.cuda.synchronize()
        assert start.elapsed_time(end) >= 0 and torch.cuda.max_memory_allocated() >= 0
        losses.append(loss.item())
    return losses, {k: v.cpu() for k, v in model.state_dict().items()}


def train_written_for_cpu(steps: int = 6) -> tuple[list[float], dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(steps):
        x = torch.randn(16, 8)
        y = torch.randn(16, 1)
        loss = F.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, model.state_dict()


@pytest.mark.parametrize("strategy", ["patch", "mode"])
def test_cuda_training_loop_gives_bit_identical_losses(plain, strategy):
    want_losses, want_state = train_written_for_cpu()
    ditorch.enable(strategy=strategy)
    ditorch.enable_cuda_compat()
    got_losses, got_state = train_written_for_cuda()
    ditorch.disable()
    assert got_losses == want_losses
    assert got_state.keys() == want_state.keys()
    assert all(torch.equal(got_state[k], want_state[k]) for k in want_state)


def test_cuda_spellings_route_to_the_vendor(compat):
    vendor = ditorch.device_obj()
    assert torch.zeros(2, device="cuda").device == vendor
    assert torch.zeros(2, device="cuda:0").device == vendor
    assert torch.zeros(2, device=torch.device("cuda", 0)).device == vendor
    assert torch.zeros(2, device=0).device == vendor
    assert torch.ones(2).cuda().device == vendor and torch.ones(2).cuda(0).device == vendor
    assert torch.ones(2).to("cuda").device == vendor
    model = torch.nn.Linear(2, 2).cuda()
    assert model.weight.device == vendor
    assert torch.cuda.is_available() is ditorch.device.is_available()
    assert torch.cuda.device_count() == ditorch.device.count()
    assert isinstance(torch.cuda.Stream(), ditorch.device.Stream)
    assert torch.cuda.memory_allocated() == ditorch.device.memory_allocated()


def test_capabilities_are_never_faked(compat):
    x = torch.zeros(1, device="cuda")
    assert x.device.type == ditorch.device.type and not x.is_cuda
    for name in ("get_device_capability", "get_device_properties", "get_device_name"):
        with pytest.raises((AssertionError, RuntimeError)):
            getattr(torch.cuda, name)()


def test_compat_is_off_by_default(shim):
    assert not ditorch.cuda_compat_enabled()
    with pytest.raises((AssertionError, RuntimeError)):
        torch.zeros(1, device="cuda")
    assert torch.cuda.is_available() is False


@pytest.mark.parametrize("strategy", ["patch", "mode"])
def test_disable_restores_torch_exactly(plain, strategy):
    before = snapshot()
    stack_before = torch._C._len_torch_function_stack()
    ditorch.enable(strategy=strategy)
    ditorch.enable_cuda_compat()
    torch.ones(2).cuda().sum().item()
    assert snapshot() != before  # the check below can fail: compat did change torch.cuda
    ditorch.disable()
    after = snapshot()
    for name, attrs in before.items():
        assert after[name].keys() == attrs.keys(), name
        changed = [k for k, v in attrs.items() if after[name][k] is not v]
        assert not changed, f"{name}: {changed} not restored"
    assert torch._C._len_torch_function_stack() == stack_before
    assert not ditorch.is_enabled() and not ditorch.cuda_compat_enabled()


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_torch_compile_under_compat(compat, backend):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2).cuda()
    x = torch.randn(3, 4, device="cuda", requires_grad=True)

    def step(x):
        return (model(x.cuda()).relu() + torch.ones(2, device="cuda")).sum()

    torch._dynamo.reset()
    got = torch.compile(step, backend=backend, fullgraph=True)(x)
    got.backward()
    got_grad, x.grad = x.grad.clone(), None
    with torch._C.DisableTorchFunction():
        want = (model(x).relu() + torch.ones(2)).sum()
        want.backward()
    assert torch.equal(got.detach(), want.detach()) and torch.equal(got_grad, x.grad)
