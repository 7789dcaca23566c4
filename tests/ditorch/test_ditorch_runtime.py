"""``ditorch.device``, the runtime namespace, with the CPU adapter (the machine has no accelerator);
references are torch's own CPU calls."""
from __future__ import annotations

import time

import pytest
import torch

import ditorch

from ditorch_testutil import run_python

pytestmark = pytest.mark.skipif(
    ditorch.current_adapter().name != "cpu", reason="these expectations are for the CPU adapter"
)


def test_identity(shim):
    d = ditorch.device
    assert (d.type, d.vendor, d.backend, d.autocast_device_type) == ("cpu", "cpu", "gloo", "cpu")
    assert d.obj() == torch.device("cpu") and d.is_available()


def test_device_index_calls(shim):
    d = ditorch.device
    assert d.count() == torch.cpu.device_count() == 1
    assert d.current() == 0
    d.set(0)
    with pytest.raises(ValueError, match=r"index 0 only; got set\(1\)"):
        d.set(1)
    d.synchronize()
    d.synchronize(0)


def test_streams_and_events(shim):
    d = ditorch.device
    s = d.Stream()
    assert isinstance(s, torch.cpu.Stream) and isinstance(d.current_stream(), torch.cpu.Stream)
    with d.stream(s):
        x = torch.ones(3, device="device") * 2
    start, end = d.Event(enable_timing=True), d.Event(enable_timing=True)
    start.record()
    time.sleep(0.01)
    end.record()
    end.synchronize()
    assert end.query() and start.elapsed_time(end) >= 10.0  # milliseconds; sleep is a lower bound
    with pytest.raises(RuntimeError, match="enable_timing=True"):
        d.Event().elapsed_time(d.Event())
    assert torch.equal(x, torch.full((3,), 2.0))


def test_memory_statistics_count_the_storage_of_live_tensors(shim):
    """On the CPU, memory_allocated and its peak are what they are on an accelerator: the bytes of live
    tensor storage (reference: the tensors' own nbytes), not the resident set. They used to be 0."""
    d = ditorch.device
    before = d.memory_allocated()
    x = torch.zeros(1000, 250, device="device")  # 1,000,000 bytes
    assert d.memory_allocated() - before == x.untyped_storage().nbytes() == 1_000_000
    assert d.memory_allocated(0) == d.memory_reserved() == d.memory_allocated()
    d.reset_peak_memory_stats()
    y = torch.ones(2000, 250, device="device") * 3  # a temporary of 2 MB beside the result's 2 MB
    peak = 1_000_000 + 2 * y.untyped_storage().nbytes()
    # (+ the multiplication's scalar, wrapped in a tensor of a few bytes)
    assert 0 <= d.max_memory_allocated() - before - peak <= 64
    del y
    assert d.memory_allocated() - before == 1_000_000 and 0 <= d.max_memory_reserved() - before - peak <= 64
    z = x.view(250, 1000)  # a view allocates nothing
    assert d.memory_allocated() - before == 1_000_000 and z.untyped_storage().data_ptr() == x.data_ptr()
    c = x._lazy_clone()  # copy-on-write clones need a plain data pointer, as torch's own allocator gives
    c.add_(1)
    assert torch.equal(c, torch.ones(1000, 250))
    assert d.memory_allocated() - before == 2_000_000
    del x, z, c
    assert d.memory_allocated() == before
    d.empty_cache()


def test_memory_statistics_switched_off_stay_zero():
    got = run_python(
        "import ditorch, torch; x = torch.ones(1000, 1000, device='device'); "
        "print(ditorch.device.memory_allocated(), ditorch.device.max_memory_allocated())",
        env={"DITORCH_CPU_MEMORY_STATS": "0"})
    assert got.returncode == 0, got.stderr
    assert got.stdout.split() == ["0", "0"]


def test_manual_seed_matches_torch(shim):
    ditorch.device.manual_seed(1234)
    got = torch.randn(5, device="device")
    torch.manual_seed(1234)
    want = torch.randn(5)
    assert torch.equal(got, want)


def test_autocast_matches_torch_autocast(shim):
    a = torch.randn(8, 8)
    b = torch.randn(8, 8)
    with ditorch.device.autocast(dtype=torch.bfloat16):
        got = a @ b
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = a @ b
    assert got.dtype == torch.bfloat16 and torch.equal(got, want)
    with ditorch.device.autocast(enabled=False):
        assert (a @ b).dtype == torch.float32
