"""``ditorch.device``, the runtime namespace, with the CPU adapter (the machine has no accelerator);
references are torch's own CPU calls."""
from __future__ import annotations

import time

import pytest
import torch

import ditorch

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


def test_memory_statistics_are_integers(shim):
    d = ditorch.device
    for call in (d.memory_allocated, d.max_memory_allocated, d.memory_reserved, d.max_memory_reserved):
        assert call() == 0 and call(0) == 0  # the CPU has no device allocator to report
    d.reset_peak_memory_stats()
    d.empty_cache()


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
