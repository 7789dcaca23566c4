"""The native diopi device (``DIOPI_DEVICE_BACKEND=native``): PrivateUse1 made a device in C++ over the
library's device-memory functions. References: CPU tensors (bytes), the CPU generator, plain torch
training. Each test runs in a fresh interpreter: the device registers once per process."""
from __future__ import annotations

import os

import pytest

from diopi_testlib import (METADATA_C, OPERATOR_CHECKS, PARTIAL_OMITTED, compile_c_library, enable_error,
                           run_python)

from test_diopi_device import TRAIN


def _packets(ops: dict[str, int]) -> set[str]:
    """Operator names without their overload."""
    return {name.split(".")[0] for name in ops}


def test_devices_have_their_own_memory_and_copies_are_byte_exact(reference_path):
    got = run_python(f"""
        import ctypes, json, torch
        from diopi_bindings import device
        from diopi_bindings.device_memory import DeviceMemory
        lib = device.enable({str(reference_path)!r}, backend="native")
        mem = DeviceMemory.of(lib)
        cpu = torch.randn(33, 17, dtype=torch.float64)
        ints = torch.randint(-2**62, 2**62, (1000,), dtype=torch.int64)
        a = cpu.to("diopi:0")
        b = a.to("diopi:1")                       # device 0 -> device 1
        c = cpu.t().to("diopi:1")                 # a transposed host tensor
        d = b.t().contiguous()                    # a strided copy on device 1
        e = ints.to("diopi:1").to("diopi:0")
        # The allocation is device 1's: the library refuses to read it as device 0's memory.
        out = torch.empty(8, dtype=torch.uint8)
        refused = None
        try:
            mem.memcpy_d2h(0, out.data_ptr(), b.data_ptr(), 8)
        except Exception as exc:
            refused = str(exc)
        mem.memcpy_d2h(1, out.data_ptr(), b.data_ptr(), 8)
        try:
            torch.empty(3, device="diopi:2")
            bad_index = None
        except RuntimeError as exc:
            bad_index = str(exc).splitlines()[0]
        mixed = []
        for op in (lambda: a + b, lambda: torch.tan(a) + torch.tan(b)):  # a library op, a CPU fallback
            try:
                op()
                mixed.append(None)
            except RuntimeError as exc:
                mixed.append(str(exc))
        print(json.dumps({{
            "devices": [str(t.device) for t in (a, b, c, d, e)],
            "storage_device": str(b.untyped_storage().device),
            "exact": [torch.equal(a.cpu(), cpu), torch.equal(b.cpu(), cpu), torch.equal(c.cpu(), cpu.t()),
                      torch.equal(d.cpu(), cpu.t()), torch.equal(e.cpu(), ints)],
            "bytes": torch.equal(out, cpu.view(torch.uint8).flatten()[:8]),
            "refused": refused, "bad_index": bad_index, "count": torch.diopi.device_count(), "mixed": mixed,
            "backend": device.backend()}}))
    """)
    assert got["devices"] == ["diopi:0", "diopi:1", "diopi:1", "diopi:1", "diopi:0"]
    assert got["storage_device"] == "diopi:1" and got["backend"] == "native" and got["count"] == 2
    assert got["exact"] == [True] * 5 and got["bytes"]
    assert "belongs to device 1, not device 0" in got["refused"]
    assert "diopi device index 2 out of range: this host has 2 diopi device(s)" in got["bad_index"]
    assert got["mixed"] == ["Expected all tensors to be on the same device, but found at least two devices, "
                            "diopi:0 and diopi:1!"] * 2


def test_generators_give_the_cpu_stream_for_the_same_seed(reference_path):
    got = run_python(f"""
        import json, torch
        from diopi_bindings import device
        device.enable({str(reference_path)!r}, backend="native")
        g = torch.Generator(device="diopi").manual_seed(5)
        x = torch.randn(1000, device="diopi", generator=g).cpu()
        y = torch.randn(1000, device="diopi", generator=g).cpu()   # the generator advanced
        ref = torch.Generator().manual_seed(5)
        rx, ry = torch.randn(1000, generator=ref), torch.randn(1000, generator=ref)
        torch.manual_seed(3)                                         # every device's default generator
        d0 = torch.rand(50, device="diopi:0").cpu()
        d1 = torch.rand(50, device="diopi:1").cpu()
        d0_again = torch.rand(50, device="diopi:0").cpu()
        ref3 = torch.Generator().manual_seed(3)
        r3 = torch.rand(50, generator=ref3)
        r3_next = torch.rand(50, generator=ref3)
        drop = torch.nn.functional.dropout(torch.ones(200, device="diopi"), 0.5).cpu()
        print(json.dumps({{"gen_device": str(g.device), "x": torch.equal(x, rx), "y": torch.equal(y, ry),
                          "d0": torch.equal(d0, r3), "d1": torch.equal(d1, r3),
                          "d0_next": torch.equal(d0_again, r3_next),
                          "dropout_values": sorted(set(drop.tolist()))}}))
    """)
    assert got["gen_device"] == "diopi:0"
    assert got["x"] and got["y"]
    assert got["d0"] and got["d1"] and got["d0_next"]  # per-device generators, each seeded by manual_seed
    assert got["dropout_values"] == [0.0, 2.0]


def test_operators_run_in_the_library_on_device_memory(reference_path):
    got = run_python(f"""
        import json, logging, torch
        logging.basicConfig(level=logging.INFO)
        from diopi_bindings import device
        device.enable({str(reference_path)!r}, backend="native")
        torch.manual_seed(0)
        a, b = torch.randn(6, 5), torch.randn(5)
        da, db = a.to("diopi:1"), b.to("diopi:1")
{OPERATOR_CHECKS}
        checks["tan (CPU fallback)"] = (torch.tan(da).cpu(), torch.tan(a))
        checks["arange (out= resized)"] = (torch.arange(0, 2.0, 0.5, device="diopi").cpu(), torch.arange(0, 2.0, 0.5))
        checks["unfold (a view)"] = (da.unfold(0, 2, 2).cpu(), a.unfold(0, 2, 2))
        dc = da.clone(); dc.add_(db); c = a.clone(); c.add_(b)
        checks["in-place add_"] = (dc.cpu(), c)
        torch.tan(da); torch.tan(da)
        bad = [k for k, (x, y) in checks.items() if not torch.allclose(x, y, rtol=1e-6, atol=1e-6)]
        print(json.dumps({{"bad": bad, "devices": sorted({{str(da.device), str((da + db).device)}}),
                          "routed": dict(device.routed_ops()), "fallbacks": dict(device.fallback_ops())}}))
    """)
    assert got["bad"] == []
    assert got["devices"] == ["diopi:1"]
    # Structured operators reach a backend as their out= form (add.out): served by the same schema operator.
    for op in ("aten::add", "aten::mul", "aten::silu", "aten::_softmax", "aten::mm", "aten::mean"):
        assert op in _packets(got["routed"]), op
    assert got["fallbacks"]["aten::tan.out"] == 3
    assert got["_stderr"].count("aten::tan.out runs on the CPU (reference-cpu does not implement it)") == 1


def test_tiny_llama_trains_like_plain_torch_on_the_native_device(reference_path):
    got = run_python(TRAIN.format(library=str(reference_path), autocompare=True, backend="native"))
    assert got["passed"], (got["ref"], got["got"])
    assert got["mre"] < 1e-5
    assert got["failures"] == [] and got["compared"] > 100
    for op in ("aten::mm", "aten::bmm", "aten::embedding", "aten::silu",
               "aten::_softmax_backward_data", "aten::rsqrt", "aten::fill_", "aten::ge", "aten::lt",
               "aten::bitwise_and", "aten::clamp", "aten::gather", "aten::index", "aten::_index_put_impl_"):
        assert op in _packets(got["routed"]), op
    assert "aten::zero_" not in got["fallbacks"]  # zero_ (gradient zeroing) is the library's fill_
    assert not {"aten::index", "aten::_index_put_impl_"} & _packets(got["fallbacks"])
    # arange.start_out (an empty out= resized) is served by the schema's arange.start_step
    assert "aten::arange" in _packets(got["routed"]) and "aten::arange" not in _packets(got["fallbacks"])
    # max.dim_max (two out= arguments) is served by the schema's max.dim
    assert got["routed"].get("aten::max.dim_max", 0) > 0 and "aten::max" not in _packets(got["fallbacks"])


def test_the_device_can_be_enabled_after_a_backward_pass(reference_path):
    got = run_python(f"""
        import json, torch
        torch.manual_seed(0)
        # float64: the library computes in double, so the CPU reference agrees to rounding
        w = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
        (w * w).sum().backward()                    # the autograd engine starts before the device exists
        from diopi_bindings import device
        device.enable({str(reference_path)!r}, backend="native")
        x = torch.randn(5, 4, dtype=torch.float64)
        wd = w.detach().to("diopi").requires_grad_()
        (x.to("diopi") @ wd).pow(2).sum().backward()
        w2 = w.detach().clone().requires_grad_()
        (x @ w2).pow(2).sum().backward()
        print(json.dumps({{"close": torch.allclose(wd.grad.cpu(), w2.grad, rtol=1e-12, atol=1e-12),
                          "grad_device": str(wd.grad.device)}}))
    """)
    assert got["close"] and got["grad_device"] == "diopi:0"


def test_a_library_without_device_memory_is_refused_for_the_native_device(tmp_path):
    lib = compile_c_library(tmp_path, "nomem", METADATA_C % {"abi": "DIOPI_ABI_VERSION"})
    error = enable_error(str(lib), backend="native")
    assert error is not None and "does not export diopi_device_count" in error
    assert "DIOPI_DEVICE_BACKEND=python" in error


# The whole suite with its large cases on device memory takes minutes on a small machine: its own target.
FULL_CONFORMANCE = pytest.mark.skipif(os.environ.get("DIOPI_CONFORMANCE") != "full",
                                      reason="the full suite on native device memory takes minutes: "
                                             "make test-diopi-full (DIOPI_CONFORMANCE=full)")


@pytest.mark.parametrize("quick", [True, pytest.param(False, marks=FULL_CONFORMANCE)], ids=["quick", "full"])
def test_the_conformance_suite_passes_on_native_device_memory(reference_path, tmp_path, quick):
    report = tmp_path / "native.json"
    got = run_python(f"""
        import json
        from diopi_bindings.conformance.cli import main
        code = main(["--impl", {str(reference_path)!r}, "--device", "native", "-q", "--json", {str(report)!r}]
                    + (["--quick"] if {quick} else []))
        print(json.dumps({{"code": code}}))
    """, timeout=900)
    assert got["code"] == 0
    import json

    data = json.loads(report.read_text())
    assert {v["verdict"] for v in data["operators"].values()} == {"pass"}
    assert len(data["cases"]) > 1000
    assert any("non-contiguous" in c["case"] for c in data["cases"])  # strided views stay strided on the device
    assert any("large" in c["case"] for c in data["cases"]) != quick


def test_ditorch_trains_on_the_native_device_through_the_unified_name(reference_path):
    got = run_python("""
        import json, torch
        import ditorch
        from diopi_bindings import device
        x = torch.randn(2, 3, device="device:1")
        g = torch.Generator(device="device")
        lin = torch.nn.Linear(3, 2).to("device")
        lin(x.to("device")).sum().backward()
        print(json.dumps({"backend": device.backend(), "x": str(x.device), "gen": str(g.device),
                          "grad": str(lin.weight.grad.device),
                          "module": type(torch.get_device_module("device")).__name__,
                          "count": torch.accelerator.device_count()}))
    """, env={"DITORCH_VENDOR": "diopi", "DIOPI_DEVICE_BACKEND": "native"})
    assert got == {"backend": "native", "x": "diopi:1", "gen": "diopi:0", "grad": "diopi:0",
                   "module": "NativeDeviceModule", "count": 2, "_stderr": got["_stderr"]}


def test_an_unknown_backend_is_refused_by_name(reference_path):
    error = enable_error(str(reference_path), env={"DIOPI_DEVICE_BACKEND": "cuda"})
    assert error == ("DIOPI_DEVICE_BACKEND='cuda' is not a diopi device backend; expected one of auto, native, "
                            "python")


def test_auto_picks_the_native_device_only_for_a_library_with_device_memory(reference_path, tmp_path):
    lib = compile_c_library(tmp_path, "nomem", METADATA_C % {"abi": "DIOPI_ABI_VERSION"})
    code = """
        import json, torch
        from diopi_bindings import device
        device.enable({path!r})
        print(json.dumps({{"backend": device.backend(), "device": str(torch.ones(1, device="diopi").device)}}))
    """
    assert run_python(code.format(path=str(reference_path)))["backend"] == "native"
    assert run_python(code.format(path=str(lib)))["backend"] == "python"


def test_a_library_missing_operators_still_trains_on_the_native_device(partial_path):
    got = run_python(TRAIN.format(library=str(partial_path), autocompare=False, backend="native"))
    assert got["passed"], (got["ref"], got["got"])
    for op in PARTIAL_OMITTED:
        assert op not in _packets(got["routed"]), op
        if op != "aten::embedding":  # without the library's kernel, embedding is its composite: index_select
            assert op in _packets(got["fallbacks"]), op
    assert "aten::index_select" in got["fallbacks"]
    assert "aten::_index_put_impl_" in _packets(got["routed"])  # the embedding's weight gradient


MASK_CHECKS = """
        torch.manual_seed(0)
        m = torch.randn(4, 5, 3)
        d = m.to("diopi")
        mask2 = m[:, :, 0] > 0
        checks = {
            "x[x > 0]": (d[d > 0], m[m > 0]),
            "all-true mask": (d[torch.ones(4, 5, 3, dtype=torch.bool, device="diopi")], m.flatten()),
            "empty mask": (d[torch.zeros(4, 5, 3, dtype=torch.bool, device="diopi")], m[m > 99]),
            "2-d mask, a dim left": (d[mask2.to("diopi")], m[mask2]),
            "mask after a slice": (d[:, mask2[0].to("diopi")], m[:, mask2[0]]),
            "mask on the CPU": (d[mask2], m[mask2]),
            "integer index": (d[:, torch.tensor([4, 0])], m[:, [4, 0]]),
        }
        dm, cm = d.clone(), m.clone()
        dm[dm < 0] = 0.0
        cm[cm < 0] = 0.0
        checks["x[mask] = 0"] = (dm, cm)
        try:
            d[torch.ones(3, dtype=torch.bool, device="diopi")]
            wrong_shape = None
        except IndexError as exc:
            wrong_shape = str(exc)
        bad = [k for k, (x, y) in checks.items() if x.device != d.device or not torch.equal(x.cpu(), y)]
        print(json.dumps({"bad": bad, "wrong_shape": wrong_shape, "routed": dict(device.routed_ops()),
                          "fallbacks": dict(device.fallback_ops())}))
"""


def _mask_indexing(reference_path, backend: str) -> dict:
    return run_python(f"""
        import json, torch
        from diopi_bindings import device
        device.enable({str(reference_path)!r}, backend={backend!r})
{MASK_CHECKS}
    """)


@pytest.mark.parametrize("backend", ["native", "python"])
def test_a_boolean_mask_index_runs_in_the_library(reference_path, backend):
    """x[mask] and x[mask] = v: the result's size depends on the data, so the library's nonzero allocates its
    result through the context's require_tensor and the mask becomes nonzero's columns (torch's own rule);
    index and index_put then run in the library. Reference: the same indexing on CPU tensors. A mask that
    does not fit the indexed dims gets torch's IndexError (from the CPU)."""
    got = _mask_indexing(reference_path, backend)
    assert got["bad"] == []
    assert "mask [3] at index 0 does not match the shape of the indexed tensor [4, 5, 3]" in got["wrong_shape"]
    assert got["routed"]["aten::nonzero"] >= 6
    index = "aten::index.Tensor_out" if backend == "native" else "aten::index.Tensor"
    put = "aten::_index_put_impl_" if backend == "native" else "aten::index_put_"
    assert got["routed"][index] >= 7 and got["routed"][put] == 1
    indexing_on_cpu = {op: n for op, n in got["fallbacks"].items() if "index" in op or "nonzero" in op}
    # Only the mask of the wrong shape, on the host-memory device (the native one's frontend refuses it first).
    assert indexing_on_cpu == ({index: 1} if backend == "python" else {})


SELECT_CHECKS = """
        torch.manual_seed(0)
        m = torch.randn(4, 5, 3)
        d = m.to("diopi")
        mask = m > 0
        row = torch.tensor([True, False, True])
        column = (m[:, :, 0] > 0).unsqueeze(-1)
        cases = {
            "same shape": (m, mask), "all true": (m, torch.ones(4, 5, 3, dtype=torch.bool)),
            "empty": (m, torch.zeros(4, 5, 3, dtype=torch.bool)), "mask broadcast": (m, row),
            "both broadcast": (m[:, :1, :], column.expand(4, 5, 1)), "self broadcast": (m[0, 0], mask),
            "int64 values": ((m * 10).long(), mask),
        }
        before = dict(device.fallback_ops())
        bad = []
        for name, (x, k) in cases.items():
            want = torch.masked_select(x, k)
            got = torch.masked_select(x.to("diopi"), k.to("diopi"))
            if got.device != d.device or got.dtype != want.dtype or not torch.equal(got.cpu(), want):
                bad.append(name)
            out = torch.empty(0, dtype=want.dtype, device="diopi")
            returned = torch.masked_select(x.to("diopi"), k.to("diopi"), out=out)
            if returned is not out or not torch.equal(out.cpu(), want):
                bad.append(name + " out=")
            rows = torch.empty(7, 2, dtype=torch.long, device="diopi")  # the wrong size: out= is resized
            returned = torch.nonzero(k.to("diopi"), out=rows)
            if returned is not rows or not torch.equal(rows.cpu(), torch.nonzero(k)):
                bad.append(name + " nonzero out=")
        try:
            torch.masked_select(d, torch.ones(4, dtype=torch.bool, device="diopi"))
            wrong_shape = None
        except RuntimeError as exc:
            wrong_shape = str(exc)
        fallbacks = {op: n - before.get(op, 0) for op, n in device.fallback_ops().items() if n > before.get(op, 0)}
        print(json.dumps({"bad": bad, "wrong_shape": wrong_shape, "fallbacks": fallbacks,
                          "routed": dict(device.routed_ops())}))
"""


@pytest.mark.parametrize("backend", ["native", "python"])
def test_masked_select_and_nonzero_out_run_in_the_library(reference_path, backend):
    """torch.masked_select is the input indexed by the nonzero columns of the mask, both broadcast to one
    shape (torch's own rule), and nonzero(out=) resizes out to the library's result: both run in the library
    (nonzero, index), none of them on the CPU. Reference: the same calls on CPU tensors, incl. broadcast masks
    and empty results; a mask that does not broadcast gets torch's error (from the CPU)."""
    got = run_python(f"""
        import json, torch
        from diopi_bindings import device
        device.enable({str(reference_path)!r}, backend={backend!r})
{SELECT_CHECKS}
    """)
    assert got["bad"] == []
    assert "must match the size of tensor" in got["wrong_shape"], got["wrong_shape"]
    on_cpu = {op: n for op, n in got["fallbacks"].items() if "index" in op or "nonzero" in op or "masked" in op}
    assert on_cpu == {"aten::masked_select": 1}, on_cpu  # only the mask that does not broadcast
    assert got["routed"]["aten::nonzero"] >= 2 * 7 and got["routed"]["aten::nonzero.out"] == 7


def test_random_operators_without_a_generator_argument_draw_from_the_device_generator(reference_path):
    """native_dropout takes no generator: its mask comes from the device's default generator (seeded by
    torch.diopi.manual_seed and torch.manual_seed), and the CPU's generator is left alone. Reference: a
    fresh CPU generator with the same seed drawing the same Bernoulli mask."""
    got = run_python(f"""
        import json, torch
        from diopi_bindings import device
        device.enable({str(reference_path)!r}, backend="native")
        x = torch.ones(2000, device="diopi")
        torch.manual_seed(0)
        torch.diopi.manual_seed(7)
        _, mask = torch.native_dropout(x, 0.3, True)
        want = torch.empty(2000).bernoulli_(0.7, generator=torch.Generator().manual_seed(7)).bool()
        cpu_untouched = torch.equal(torch.rand(5), torch.rand(5, generator=torch.Generator().manual_seed(0)))
        torch.manual_seed(11)
        first = torch.native_dropout(x, 0.3, True)[1].cpu()
        second = torch.native_dropout(x, 0.3, True)[1].cpu()
        torch.manual_seed(11)
        again = torch.native_dropout(x, 0.3, True)[1].cpu()
        print(json.dumps({{"device_mask": torch.equal(mask.cpu(), want), "cpu_untouched": cpu_untouched,
                          "reproducible": torch.equal(first, again), "advances": not torch.equal(first, second)}}))
    """)
    assert (got["device_mask"], got["cpu_untouched"], got["reproducible"], got["advances"]) == (True,) * 4, got


def test_random_operators_are_thread_safe(reference_path):
    """Threads drawing at once: two on one device generator (torch.rand), one with native_dropout on the
    other device, one on the CPU's default generator. References: fresh CPU generators with the same seeds,
    drawn sequentially. Each device draw is one chunk of its seed's stream (the two threads sharing a
    generator together take its first chunks, none twice); the dropout masks are its seed's Bernoulli
    stream in order; the CPU thread's numbers are the CPU stream untouched by the device's draws."""
    got = run_python(f"""
        import json, sys, threading, torch
        from diopi_bindings import device
        device.enable({str(reference_path)!r}, backend="native")
        sys.setswitchinterval(1e-6)  # threads switch between any two bytecodes: races show within the run
        N, CHUNK = 150, 64
        torch.diopi.default_generator(1).manual_seed(9)
        torch.diopi.default_generator(0).manual_seed(7)
        torch.default_generator.manual_seed(0)
        shared, masks, cpu = [[], []], [], []
        x = torch.ones(500, device="diopi:0")

        def rand_on_1(out):
            for _ in range(N):
                out.append(torch.rand(CHUNK, device="diopi:1").cpu())

        def dropout_on_0():
            for _ in range(N):
                masks.append(torch.native_dropout(x, 0.3, True)[1].cpu())

        device_threads_done = threading.Event()

        def cpu_draws():  # all the while the device threads run (bounded)
            while not device_threads_done.is_set() and len(cpu) < 100 * N:
                cpu.append(torch.rand(CHUNK))

        q_cpu, mask_cpu = torch.arange(64.0).reshape(1, 2, 8, 4) / 64, torch.eye(8)
        q, mask, attention = q_cpu.to("diopi:0"), mask_cpu.to("diopi:0"), []
        flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default

        def attention_on_0():  # random without a generator argument, on the CPU (the library takes no mask)
            for _ in range(N):
                attention.append(flash(q, q, q, 0.0, attn_mask=mask)[0].cpu())

        threads = [threading.Thread(target=rand_on_1, args=(shared[0],)),
                   threading.Thread(target=rand_on_1, args=(shared[1],)),
                   threading.Thread(target=dropout_on_0), threading.Thread(target=cpu_draws),
                   threading.Thread(target=attention_on_0)]
        for t in threads: t.start()
        for t in threads[:3] + threads[4:]: t.join()
        device_threads_done.set()
        threads[3].join()
        g9, g7, g0 = (torch.Generator().manual_seed(s) for s in (9, 7, 0))
        want_shared = {{tuple(torch.rand(CHUNK, generator=g9).tolist()) for _ in range(2 * N)}}
        got_shared = [tuple(c.tolist()) for c in shared[0] + shared[1]]
        want_masks = [torch.empty(500).bernoulli_(0.7, generator=g7).bool() for _ in range(N)]
        want_cpu = [torch.rand(CHUNK, generator=g0) for _ in range(len(cpu))]
        print(json.dumps({{
            "shared_distinct": len(set(got_shared)) == 2 * N, "shared_stream": set(got_shared) == want_shared,
            "masks": all(torch.equal(a, b) for a, b in zip(masks, want_masks)) and len(masks) == N,
            "cpu": all(torch.equal(a, b) for a, b in zip(cpu, want_cpu)) and len(cpu) > 0,
            "attention": len(attention) == N and all(
                torch.equal(a, flash(q_cpu, q_cpu, q_cpu, 0.0, attn_mask=mask_cpu)[0]) for a in attention)}}))
    """)
    assert got == {"shared_distinct": True, "shared_stream": True, "masks": True, "cpu": True, "attention": True,
                   "_stderr": got["_stderr"]}


def test_every_aten_random_operator_without_a_generator_argument_gets_the_device_generator_explicitly():
    """The ATen random operators without a generator argument that the device's fallback can receive and
    the CPU can run (a CPU kernel, no composite one that decomposes first): each has an equivalent with the
    device generator explicit, so none borrows the CPU's default generator. Reference: ATen's own tags and
    dispatch table."""
    import torch
    from diopi_bindings import _C_diopi

    reachable = set()
    for name in dir(torch.ops.aten):
        packet = getattr(torch.ops.aten, name, None)
        if not isinstance(packet, torch._ops.OpOverloadPacket):
            continue
        for overload in packet.overloads():
            op = getattr(packet, overload)
            if (torch.Tag.nondeterministic_seeded not in op.tags
                    or any(a.name == "generator" for a in op._schema.arguments)):
                continue
            qualified = op._schema.name + (f".{op._schema.overload_name}" if op._schema.overload_name else "")
            kernels = {key for key in ("CPU", "CompositeImplicitAutograd", "CompositeExplicitAutograd")
                       if torch._C._dispatch_has_kernel_for_dispatch_key(qualified, key)}
            if kernels == {"CPU"}:
                reachable.add(op)
    names = {op._schema.name + (f".{op._schema.overload_name}" if op._schema.overload_name else "") for op in reachable}
    assert "aten::native_dropout" in names
    assert names - set(_C_diopi.draw_explicitly()) == set()


def test_the_caching_allocator_reuses_freed_blocks_and_never_referenced_ones(reference_path):
    """Freed device memory is kept per device and handed out again for the same rounded size, without a
    library malloc (the reference library counts its mallocs); memory a view still references is never
    handed out (its bytes stay those copied in from the host); empty_cache gives the blocks back (the
    library's live-block count drops); the statistics agree with the sizes allocated."""
    got = run_python(f"""
        import ctypes, json, torch
        from diopi_bindings import device
        lib = device.enable({str(reference_path)!r}, backend="native")
        mallocs = lambda: lib._dll.diopiref_malloc_calls()
        live = lambda: lib._dll.diopiref_live_blocks()
        host = torch.randn(1000, dtype=torch.float64)
        a = host.to("diopi:0")
        first = a.data_ptr()
        del a
        before = mallocs()
        b = torch.empty(1000, dtype=torch.float64, device="diopi:0")     # same size: the cached block
        reused = b.data_ptr() == first and mallocs() == before
        c = torch.empty(999, dtype=torch.float64, device="diopi:0")      # rounds to the same 8 KiB: a new block
        other_device = torch.empty(1000, dtype=torch.float64, device="diopi:1")
        view = b[10:20]
        view.copy_(host[10:20].to("diopi:0"))
        del b                                                             # the view keeps the storage
        d = torch.empty(1000, dtype=torch.float64, device="diopi:0")
        kept = d.data_ptr() != first and torch.equal(view.cpu(), host[10:20])
        for _ in range(50):                                               # a training loop's steady state
            x = torch.randn(256, 256, device="diopi:0")
            y = x * 2 + 1
            del x, y
        steady_before = mallocs()
        for _ in range(50):
            x = torch.randn(256, 256, device="diopi:0")
            y = x * 2 + 1
            del x, y
        steady = mallocs() - steady_before
        allocated = torch.diopi.memory_allocated(0)
        reserved = torch.diopi.memory_reserved(0)
        stats = torch.diopi.memory_stats(0)
        del c, d, view, other_device
        live_before = live()
        torch.diopi.empty_cache()
        print(json.dumps({{"reused": reused, "kept": kept, "steady": steady, "allocated": allocated,
                          "reserved": reserved, "after_free": torch.diopi.memory_allocated(0),
                          "device_alloc": stats["num_device_alloc"], "live_before": live_before,
                          "live_after": live(), "accelerator": torch.accelerator.memory_allocated(0)}}))
    """)
    assert got["reused"] and got["kept"]
    assert got["steady"] == 0                      # no library malloc once the loop's sizes are cached
    # live then: b's storage (the view), c (999 * 8 -> 8192), d; each 8000 B rounded to 8192
    assert got["allocated"] == 3 * 8192 and got["reserved"] >= got["allocated"] + 2 * 262144
    assert got["after_free"] == 0 and got["accelerator"] == 0 and got["device_alloc"] >= 4
    assert got["live_before"] > 0 and got["live_after"] == 0


def test_without_caching_every_free_goes_to_the_library(reference_path):
    got = run_python(f"""
        import json, torch
        from diopi_bindings import device
        lib = device.enable({str(reference_path)!r}, backend="native")
        torch.diopi.set_caching(False)
        before = lib._dll.diopiref_malloc_calls()
        for _ in range(10):
            x = torch.empty(1000, device="diopi")
            del x
        print(json.dumps({{"mallocs": lib._dll.diopiref_malloc_calls() - before,
                          "live": lib._dll.diopiref_live_blocks()}}))
    """)
    assert got["mallocs"] == 10 and got["live"] == 0
