"""The unified device name "device" wherever torch takes a device. On a machine without accelerators CPU
tensors stand in for device tensors (the CPU adapter is chosen); references are computed on the real device
with every torch-function mode disabled, so they never run through ditorch."""
from __future__ import annotations

import threading

import pytest
import torch

import ditorch
from ditorch_testutil import EXPECTED_TYPE, placed


def reference(fn):
    """Run ``fn`` with torch-function modes (ditorch's included) switched off."""
    with torch._C.DisableTorchFunction():
        return fn()


FACTORIES = {
    "randn": lambda d: torch.randn(3, 4, device=d),
    "rand": lambda d: torch.rand(5, device=d, dtype=torch.float64),
    "randint": lambda d: torch.randint(0, 10, (6,), device=d),
    "zeros": lambda d: torch.zeros(2, 3, device=d),
    "ones": lambda d: torch.ones(2, device=d, dtype=torch.int32),
    "empty": lambda d: torch.empty(0, 3, device=d),
    "full": lambda d: torch.full((2, 2), 7.5, device=d),
    "arange": lambda d: torch.arange(0, 10, 2, device=d),
    "linspace": lambda d: torch.linspace(0, 1, 5, device=d),
    "eye": lambda d: torch.eye(3, device=d),
    "tensor": lambda d: torch.tensor([[1.0, 2.0]], device=d),
    "zeros_like": lambda d: torch.zeros_like(torch.ones(2), device=d),
    "randn_like": lambda d: torch.randn_like(torch.ones(3), device=d),
    "as_tensor": lambda d: torch.as_tensor([1, 2, 3], device=d),
}


@pytest.mark.parametrize("name", sorted(FACTORIES))
@pytest.mark.parametrize("spelling", ["device", "device:0"])
def test_factory_functions_match_plain_torch(shim, name, spelling):
    torch.manual_seed(7)
    got = FACTORIES[name](spelling)
    torch.manual_seed(7)
    want = reference(lambda: FACTORIES[name](ditorch.device_obj()))
    assert got.device == placed()
    assert got.dtype == want.dtype and got.shape == want.shape
    if name != "empty":
        assert torch.equal(got, want)


def test_unified_device_name_is_rejected_without_the_shim(plain):
    with pytest.raises(RuntimeError, match="device"):
        torch.zeros(1, device="device")


def test_tensor_to_positional_and_keyword(shim):
    x = reference(lambda: torch.arange(6.0).reshape(2, 3))
    assert torch.equal(x.to("device").cpu(), x)
    assert x.to(device="device").device.type == shim.device.type
    y = x.to("device", torch.float64)
    assert y.dtype == torch.float64 and torch.equal(y.cpu(), reference(lambda: x.double()))
    z = x.to("device:0", non_blocking=True, copy=True)
    assert torch.equal(z.cpu(), x) and z.data_ptr() != x.data_ptr()


def test_non_device_arguments_pass_through(shim):
    x = torch.ones(2, 2)
    assert x.to(torch.float16).dtype == torch.float16
    assert x.to(torch.zeros(1, dtype=torch.int64)).dtype == torch.int64
    assert torch.zeros(1, device="cpu").device == torch.device("cpu")
    assert torch.zeros(1, device=torch.device("cpu")).device == torch.device("cpu")


NEW_METHODS = {
    "new_zeros": lambda t, d: t.new_zeros(2, 2, device=d),
    "new_ones": lambda t, d: t.new_ones(3, device=d),
    "new_full": lambda t, d: t.new_full((2,), 3.0, device=d),
    "new_empty": lambda t, d: t.new_empty(4, device=d),
    "new_tensor": lambda t, d: t.new_tensor([1.0, 2.0], device=d),
}


@pytest.mark.parametrize("name", sorted(NEW_METHODS))
def test_tensor_new_methods(shim, name):
    base = reference(lambda: torch.ones(1, dtype=torch.float64))
    got = NEW_METHODS[name](base, "device")
    want = reference(lambda: NEW_METHODS[name](base.to(ditorch.device_obj()), ditorch.device_obj()))
    assert got.device == placed()
    assert got.dtype == want.dtype == torch.float64 and got.shape == want.shape
    if name != "new_empty":
        assert torch.equal(got, want)


def test_module_to_positional_and_keyword(shim):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1))
    snapshot = {k: v.clone() for k, v in model.state_dict().items()}
    model.to("device")
    assert all(p.device == placed() for p in model.parameters())
    model.to(device="device", dtype=torch.float64)
    assert all(p.dtype == torch.float64 for p in model.parameters())
    for key, value in model.state_dict().items():
        assert torch.equal(value.cpu(), snapshot[key].double())


def test_tensor_device_reports_the_real_device(shim):
    x = torch.zeros(1, device="device")
    assert isinstance(x.device, torch.device)
    assert x.device.type == ditorch.device.type == EXPECTED_TYPE
    assert str(x.device) != "device"


def test_device_obj_is_a_real_torch_device(shim):
    d = ditorch.device_obj()
    assert isinstance(d, torch.device) and type(d) is torch.device
    assert d == reference(lambda: torch.device(EXPECTED_TYPE))
    # torch.device("device") itself raises in torch's C++ parser; ditorch leaves torch.device alone.
    with pytest.raises(RuntimeError, match="Expected one of"):
        torch.device("device")


def test_bad_index_is_a_clear_error(shim):
    with pytest.raises(ValueError, match="'device:<index>'"):
        torch.zeros(1, device="device:x")


def test_autograd_through_the_unified_device(shim):
    real = ditorch.device_obj()
    w_ref = reference(lambda: torch.linspace(-1, 1, 6, device=real).reshape(2, 3).requires_grad_())
    x_ref = reference(lambda: torch.arange(3.0, device=real))
    loss_ref = reference(lambda: ((w_ref @ x_ref).tanh() ** 2).sum())
    reference(loss_ref.backward)

    w = torch.linspace(-1, 1, 6, device="device").reshape(2, 3).requires_grad_()
    loss = ((w @ torch.arange(3.0, device="device")).tanh() ** 2).sum()
    loss.backward()
    assert torch.equal(loss.detach(), loss_ref.detach())
    assert torch.equal(w.grad, w_ref.grad)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_torch_compile(shim, backend):
    torch.manual_seed(0)
    lin = reference(lambda: torch.nn.Linear(3, 2).to(ditorch.device_obj()))

    def step(x):
        y = lin(x.to("device")) + torch.ones(2, device="device")
        return y.relu().sum() + torch.zeros(1, device="device:0")

    x = torch.randn(4, 3, requires_grad=True)
    want = reference(lambda: step_plain(lin, x))
    torch._dynamo.reset()
    got = torch.compile(step, backend=backend, fullgraph=True)(x)
    assert torch.equal(got.detach(), want.detach())
    got.sum().backward()
    grad = x.grad.clone()
    x.grad = None
    reference(lambda: want.sum().backward())
    assert torch.equal(grad, x.grad)


def step_plain(lin, x):
    real = ditorch.device_obj()
    y = lin(x.to(real)) + torch.ones(2, device=real)
    return y.relu().sum() + torch.zeros(1, device=real)


def test_strategies_across_threads(shim):
    """The patch strategy is process-wide; a torch-function mode is per thread, so with the mode
    strategy a new thread calls ditorch.enable() itself."""
    results = {}
    strategy = ditorch.active_strategy()

    def worker():
        try:
            results["before"] = torch.zeros(1, device="device").device
        except RuntimeError:
            results["before"] = "error"
        if strategy == "mode":
            ditorch.enable(strategy="mode")
        results["after"] = torch.zeros(1, device="device").device
        if strategy == "mode":
            ditorch.disable()  # this thread's mode only

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    before = placed() if strategy == "patch" else "error"
    assert results == {"before": before, "after": placed()}
    assert ditorch.is_enabled()  # the worker's disable() touched only its own thread


def test_early_bound_functions_need_the_mode_strategy(plain):
    from torch import zeros  # bound before the shim is enabled, as in a module imported earlier

    ditorch.enable(strategy="patch")
    with pytest.raises(RuntimeError, match="device"):
        zeros(1, device="device")
    ditorch.enable(strategy="mode")
    assert zeros(1, device="device").device == placed()


def test_patch_strategy_covers_the_factories(plain):
    from ditorch.patching import device_taking_torch_functions

    names = set(device_taking_torch_functions())
    assert {n for n in FACTORIES} <= names
    assert {"Generator", "device"}.isdisjoint(names)  # classes stay untouched


def test_unknown_strategy_is_a_clear_error(plain):
    with pytest.raises(ValueError, match="unknown ditorch strategy 'magic'; expected one of patch, mode"):
        ditorch.enable(strategy="magic")


def test_disable_removes_the_mode_under_other_modes(plain):
    from torch.overrides import BaseTorchFunctionMode

    ditorch.enable(strategy="mode")
    ditorch.enable(strategy="mode")
    with BaseTorchFunctionMode() as outer:
        ditorch.disable()
        stack = [torch._C._get_function_stack_at(i) for i in range(torch._C._len_torch_function_stack())]
        assert stack == [outer] and not ditorch.is_enabled()
    assert torch._C._len_torch_function_stack() == 0


def test_plain_torch_compile_with_a_mode_after_the_patch_strategy(plain):
    """torch.compile snapshots Tensor attributes on first use; after disable() a plain program
    (here one with its own torch-function mode) must compile as if ditorch had never been on."""
    from torch.overrides import BaseTorchFunctionMode

    ditorch.enable(strategy="patch")
    torch._dynamo.reset()
    torch.compile(lambda x: x.to("device") * 2, backend="eager", fullgraph=True)(torch.ones(2))
    ditorch.disable()
    torch._dynamo.reset()
    with BaseTorchFunctionMode():
        out = torch.compile(lambda x: x.to(torch.float64) + 1, backend="eager", fullgraph=True)(torch.ones(2))
    assert out.dtype == torch.float64 and torch.equal(out, torch.full((2,), 2.0, dtype=torch.float64))
