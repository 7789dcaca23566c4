"""Streams, events and async copies of the native diopi device, with a vendor library that really runs
asynchronously (async_vendor/: its operators, written against DeepLink's DIOPI, queue their work on the stream
diopiGetStream gives them and return; a worker thread per stream runs it later). While the test holds the
vendor's workers, a raw read of a result's device memory (the vendor's own synchronous memcpy, which waits for
no stream) shows the result is not there yet; reads through torch are right because the device synchronizes
the stream first. References: plain CPU torch on the same inputs. Host memory stands in for device memory."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from diopi_bindings.abi import INCLUDE_DIR as OWN_INCLUDE
from diopi_bindings.deeplink import INCLUDE_DIR as DEEPLINK_INCLUDE
from diopi_testlib import run_python

SOURCES = Path(__file__).resolve().parent / "async_vendor"


@pytest.fixture(scope="module")
def async_vendor(tmp_path_factory) -> Path:
    """runtime.cpp against the project's device-memory ABI, ops.cpp against DeepLink's headers: one library."""
    compiler = shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        pytest.skip("no C++ compiler")
    out = tmp_path_factory.mktemp("async_vendor")
    objects = []
    for source, include in (("runtime.cpp", OWN_INCLUDE), ("ops.cpp", DEEPLINK_INCLUDE)):
        obj = out / (source + ".o")
        subprocess.run([compiler, "-std=c++17", "-fPIC", "-O1", "-c", f"-I{include}", str(SOURCES / source),
                        "-o", str(obj)], check=True, capture_output=True, text=True)
        objects.append(str(obj))
    lib = out / "libasync_vendor.so"
    subprocess.run([compiler, "-shared", *objects, "-o", str(lib), "-lpthread"], check=True, capture_output=True,
                   text=True)
    return lib


ATTACH = """
    import ctypes, json, torch
    from diopi_bindings import device, deeplink
    device.enable({lib!r}, backend="native")
    deeplink.attach({lib!r})
    vendor = ctypes.CDLL({lib!r})
    for name in ("asyncvendor_ran_on_worker", "asyncvendor_queued", "asyncvendor_scratch_on_device",
                 "asyncvendor_scratch_elsewhere"):
        getattr(vendor, name).restype = ctypes.c_int64
    d = torch.device("diopi")

    def raw(t):  # the device bytes as they are now: the vendor's synchronous copy, no stream synchronized
        out = torch.empty_like(t, device="cpu")
        vendor.diopi_memcpy_d2h(0, ctypes.c_void_p(out.data_ptr()), ctypes.c_void_p(t.data_ptr()),
                                ctypes.c_int64(t.nbytes))
        return out
"""


def test_results_of_queued_work_are_read_only_after_the_stream_ran_it(async_vendor: Path) -> None:
    got = run_python(ATTACH.format(lib=str(async_vendor)) + """
    torch.manual_seed(0)
    a, b = torch.randn(64, 48), torch.randn(48, 32)
    da, db = a.to(d), b.to(d)
    vendor.asyncvendor_hold(1)
    ran = vendor.asyncvendor_ran_on_worker()
    c = da @ db                            # diopiMm: queued, not run (the workers are held)
    e = c * c + c                          # diopiMul, diopiAdd: queued after it
    stale = not torch.equal(raw(e), (a @ b) * (a @ b) + a @ b)
    event = torch.Event(device="diopi")
    event.record()
    pending = not event.query()
    ran_before_read = vendor.asyncvendor_ran_on_worker() - ran
    got_e = e.cpu()                        # the device synchronizes the stream, then copies
    ref = (a.double() @ b.double())
    ref = ref * ref + ref
    print(json.dumps({
        "stale": stale, "pending": pending, "ran_before_read": ran_before_read,
        "ran": vendor.asyncvendor_ran_on_worker() - ran, "event_done": event.query(),
        "err": float((got_e.double() - ref).abs().max() / ref.abs().max()),
        "scratch_on_device": vendor.asyncvendor_scratch_on_device(),
        "scratch_elsewhere": vendor.asyncvendor_scratch_elsewhere(),
        "routed": dict(deeplink.routed_ops()), "has_streams": torch.diopi.has_streams()}))
    """)
    assert got["has_streams"]
    assert got["stale"] and got["pending"] and got["ran_before_read"] == 0, got  # queued, not run
    assert got["ran"] >= 3 and got["event_done"], got                           # run by the workers
    assert got["err"] < 1e-6, got
    assert got["scratch_on_device"] == 1 and got["scratch_elsewhere"] == 0      # diopiRequireBuffer: device memory
    for op in ("aten::mm", "aten::mul.Tensor", "aten::add.Tensor"):
        assert got["routed"].get(op) == 1, got["routed"]


def test_a_second_stream_async_copies_and_events_order_the_work(async_vendor: Path) -> None:
    got = run_python(ATTACH.format(lib=str(async_vendor)) + """
    torch.manual_seed(1)
    a, b = torch.randn(1000), torch.randn(1000)
    vendor.asyncvendor_hold(1)
    queued = vendor.asyncvendor_queued()
    src = a.clone()
    da = src.to(d, non_blocking=True)        # queued on the current stream; the framework keeps src alive
    del src
    async_h2d = vendor.asyncvendor_queued() - queued == 1 and not torch.equal(raw(da), a)
    db = b.to(d)                              # synchronous: after the stream, so after da's copy
    r = da + db                               # queued on the default stream (held)
    default = torch.diopi.current_stream()
    side = torch.diopi.Stream()
    with torch.diopi.stream(side):
        on_side = torch.diopi.current_stream() == side
        side.wait_stream(default)             # an event of the default stream that side waits for
        q = r * r                             # on side, after r
    default.wait_stream(side)                 # the default stream waits for side's work
    got_q = q.cpu()                           # synchronizes the default stream: r, then side's q
    h = r.to("cpu", non_blocking=True)        # queued on the default stream
    h_stale = vendor.asyncvendor_queued() > 0
    torch.diopi.synchronize()
    print(json.dumps({
        "async_h2d": async_h2d, "on_side": on_side,
        "handles_differ": default.native_handle != side.native_handle and default.native_handle != 0,
        "q": float((got_q - (a + b) * (a + b)).abs().max()), "h": float((h - (a + b)).abs().max())}))
    """)
    assert got["async_h2d"] and got["on_side"] and got["handles_differ"], got
    assert got["q"] == 0 and got["h"] == 0, got


def test_memory_recorded_on_another_stream_is_not_reused_before_that_stream_passes(async_vendor: Path) -> None:
    """x is read by work queued on a side stream (held); x.record_stream(side), then x is dropped. A tensor of
    the same size allocated on the default stream must not get x's block while side's read is pending: with
    the block reused, the default stream's fill (run first) would overwrite x before side reads it."""
    got = run_python(ATTACH.format(lib=str(async_vendor)) + """
    x = torch.full((4096,), 2.0).to(d)        # synchronous copy: done before the workers are held
    x_ptr = x.data_ptr()
    vendor.asyncvendor_hold(1)
    default = torch.diopi.current_stream()
    side = torch.diopi.Stream()
    side.wait_stream(default)
    with torch.diopi.stream(side):
        y = x * x                              # diopiMul queued on side: reads x later
    x.record_stream(side)
    del x                                      # freed while side's read is pending
    w = torch.empty(4096, device=d)            # the default stream's allocation of the same size
    reused = w.data_ptr() == x_ptr
    w.fill_(7.0)                               # queued on the default stream
    default.synchronize()                      # runs the fill first (side is still held)
    side.synchronize()
    with torch.diopi.stream(side):
        got_y = y.cpu()
    later = torch.empty(4096, device=d)        # side has passed its event: the block is free again
    print(json.dumps({"reused": reused, "y": float((got_y - 4.0).abs().max()),
                      "reused_later": later.data_ptr() == x_ptr, "routed": dict(deeplink.routed_ops())}))
    """)
    assert got["routed"].get("aten::mul.Tensor") == 1, got  # y really was queued on side
    assert not got["reused"] and got["y"] == 0, got
    assert got["reused_later"], got
