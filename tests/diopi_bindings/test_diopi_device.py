"""The host-memory diopi device (backend "python"): ATen operators on it run in the DIOPI library (host
memory stands in for device memory), the rest on the CPU, logged once per operator; heteropp's tiny LLaMA trains on it
like plain CPU torch. Each test runs in a fresh interpreter: the device registers once per process."""
from __future__ import annotations

import torch
from diopi_testlib import OPERATOR_CHECKS, PARTIAL_OMITTED, enable_error, run_python


def test_operators_match_the_cpu_and_run_in_the_library(reference_path):
    got = run_python(f"""
        import json, torch
        from diopi_bindings import device
        device.enable({str(reference_path)!r}, backend="python")
        torch.manual_seed(0)
        a, b = torch.randn(6, 5), torch.randn(5)
        da, db = a.to("diopi"), b.to("diopi")
{OPERATOR_CHECKS}
        dc = da.clone(); dc.add_(db); c = a.clone(); c.add_(b)
        checks["in-place add_"] = (dc.cpu(), c)
        bad = [k for k, (x, y) in checks.items() if not torch.allclose(x, y, rtol=1e-6, atol=1e-6)]
        back = da.cpu()
        print(json.dumps({{"bad": bad, "device": str(da.device), "back": [type(back).__name__, str(back.device)],
                          "routed": dict(device.routed_ops()), "copies": dict(device.copy_ops())}}))
    """)
    assert got["bad"] == []
    assert got["device"] == "diopi:0" and got["back"] == ["Tensor", "cpu"]
    for op in ("aten::add.Tensor", "aten::mul.Tensor", "aten::silu", "aten::_softmax", "aten::mm", "aten::mean.dim",
               "aten::add_.Tensor"):
        assert got["routed"].get(op, 0) >= 1, op
    assert got["copies"]["aten::_to_copy"] >= 1  # device -> CPU is the framework's copy, not a fallback


def test_scalar_out_and_inplace_overloads_reach_the_schema_operator(reference_path):
    got = run_python(f"""
        import json, torch
        from diopi_bindings import device
        device.enable({str(reference_path)!r}, backend="python")
        torch.manual_seed(0)
        a, b, v = torch.randn(6, 5), torch.randn(5), torch.rand(6, 5)
        da, db, dv = a.to("diopi"), b.to("diopi"), v.to("diopi")
        a64, b64, v64 = a.double(), b.double(), v.double()
        out = torch.empty(6, 5, device="diopi")
        same = torch.div(da, db, out=out) is out
        dc = da.clone(); torch.ops.aten.mul_.Scalar(dc, 3.0)
        dv.addcmul_(da, da, value=0.1).sqrt_()
        checks = {{
            "div out=": (out, a64 / b64),
            "mul.Scalar": (torch.ops.aten.mul.Scalar(da, 0.5), a64 * 0.5),
            "add.Scalar": (torch.ops.aten.add.Scalar(da, 2.0, 0.5), a64 + 1.0),
            "mul_.Scalar": (dc, a64 * 3.0),
            "addcmul_ sqrt_": (dv, v64.addcmul(a64, a64, value=0.1).sqrt()),
            "cos sin log reciprocal": (dv.cos() + dv.sin() + dv.log() + dv.reciprocal(),
                                       (lambda w: w.cos() + w.sin() + w.log() + w.reciprocal())(
                                           v64.addcmul(a64, a64, value=0.1).sqrt().float().double())),
        }}
        bad = {{k: float((x.cpu().double() - y).abs().max()) for k, (x, y) in checks.items()
                if not torch.allclose(x.cpu().double(), y, rtol=1e-6, atol=1e-6)}}
        print(json.dumps({{"bad": bad, "same": same, "routed": dict(device.routed_ops()),
                          "fallbacks": dict(device.fallback_ops())}}))
    """)
    assert got["bad"] == {} and got["same"]
    for op in ("aten::div.out", "aten::mul.Scalar", "aten::add.Scalar", "aten::mul_.Scalar", "aten::addcmul_",
               "aten::sqrt_", "aten::cos", "aten::sin", "aten::log", "aten::reciprocal"):
        assert op in got["routed"], op
    assert got["fallbacks"] == {}


def test_operators_that_resize_or_restride_a_device_tensor_update_its_sizes(reference_path):
    """``out=`` tensors the operator resizes and in-place metadata operators: the device tensor shows
    the sizes and strides plain CPU torch gives, not the ones it had before."""
    got = run_python(f"""
        import json, warnings, torch
        from diopi_bindings import device
        device.enable({str(reference_path)!r}, backend="python")
        warnings.simplefilter("ignore")  # torch warns when out= of the wrong non-empty shape is resized
        a, b = torch.randn(4, 3), torch.randn(3)
        results = {{}}
        for where in ("cpu", "diopi"):
            da, db = a.to(where), b.to(where)
            add_out, cumsum_out, wrong = (torch.empty(0, device=where), torch.empty(0, device=where),
                                          torch.empty(2, 2, device=where))
            torch.add(da, db, out=add_out)
            torch.cumsum(da, 0, out=cumsum_out)
            torch.mul(da, 2.0, out=wrong)
            squeezed = da.clone().unsqueeze_(0)
            transposed = da.clone().t_()
            resized = da.clone().resize_(2, 6)
            results[where] = {{name: [list(t.shape), list(t.stride()), t.cpu().tolist()] for name, t in (
                ("add out=", add_out), ("cumsum out=", cumsum_out), ("mul out= of another shape", wrong),
                ("unsqueeze_", squeezed), ("t_", transposed), ("resize_", resized))}}
        print(json.dumps(results))
    """)
    for name, want in got["cpu"].items():
        assert got["diopi"][name] == want, name


def test_repeated_signatures_with_other_arguments_get_their_own_result_shapes(reference_path):
    """The router caches meta results per argument signature: calls that differ only in an integer,
    a flag or a number's type must still get the shapes and dtypes plain CPU torch gives."""
    got = run_python(f"""
        import json, torch
        from diopi_bindings import device
        device.enable({str(reference_path)!r}, backend="python")
        x, i = torch.randn(3, 4), torch.arange(12).reshape(3, 4)
        results = {{}}
        for where in ("cpu", "diopi"):
            dx, di = x.to(where), i.to(where)
            outs = [dx.sum(0), dx.sum(1), dx.sum(1, keepdim=True), dx.sum([0, 1]), di + 2, di + 2.5, di + 3.5,
                    di * True, dx.mean(0), dx.mean(1), di - di * di]
            results[where] = [[list(t.shape), str(t.dtype), t.cpu().tolist()] for t in outs]
        print(json.dumps({{**results, "routed": dict(device.routed_ops())}}))
    """)
    for (shape, dtype, values), (want_shape, want_dtype, want) in zip(got["diopi"], got["cpu"]):
        assert (shape, dtype) == (want_shape, want_dtype)
        assert torch.allclose(torch.tensor(values), torch.tensor(want), rtol=1e-6, atol=1e-6)
    assert got["routed"]["aten::sum.dim_IntList"] >= 4
    assert got["routed"]["aten::sub.Tensor"] >= 1 and got["routed"]["aten::mul.Tensor"] >= 1  # int64 too


def test_list_masking_and_number_power_operators_run_in_the_library(reference_path):
    """The rotary code's cat and 10000 ** x, the attention's causal mask (tril, where): in the library,
    equal to plain CPU torch; pow_ with a number exponent still reaches pow.Tensor_Scalar, not pow.Scalar."""
    got = run_python(f"""
        import json, torch
        from diopi_bindings import device
        device.enable({str(reference_path)!r}, backend="python")
        torch.manual_seed(0)
        a, b, s = torch.randn(2, 3, 4), torch.randn(2, 3, 2), torch.randn(2, 6, 6)
        results = {{}}
        for where in ("cpu", "diopi"):
            da, db, ds = a.to(where), b.to(where), s.to(where)
            mask = torch.ones(6, 6, dtype=torch.bool, device=where).tril()
            outs = {{"cat": torch.cat([da, db], -1), "cat dim 0": torch.cat([da, da], 0),
                     "pow.Scalar": torch.pow(10000.0, torch.arange(0, 8, 2, device=where).float() / 8),
                     "tril": ds.tril(-1), "mask": mask,
                     "where": torch.where(mask, ds, torch.full((), float("-inf"), device=where)),
                     "pow_": da.clone().abs().pow_(1.5)}}
            results[where] = {{k: [list(v.shape), str(v.dtype), v.cpu().double().tolist()] for k, v in outs.items()}}
        print(json.dumps({{**results, "routed": dict(device.routed_ops()), "fallbacks": dict(device.fallback_ops())}}))
    """)
    for name, (shape, dtype, values) in got["cpu"].items():
        got_shape, got_dtype, got_values = got["diopi"][name]
        assert (got_shape, got_dtype) == (shape, dtype), name
        assert torch.allclose(torch.tensor(got_values, dtype=torch.float64), torch.tensor(values, dtype=torch.float64),
                              rtol=1e-6, atol=1e-6, equal_nan=True), name
    for op in ("aten::cat", "aten::pow.Scalar", "aten::tril", "aten::where.self", "aten::pow_.Scalar"):
        assert op in got["routed"], (op, got["fallbacks"])
    assert not {"aten::cat", "aten::pow.Scalar", "aten::tril", "aten::where.self"} & set(got["fallbacks"])


def test_allocations_fills_whole_reductions_and_item_are_not_cpu_fallbacks(reference_path):
    """empty_like is device memory, ones/zeros/full_like a fill in the library, sum(x)/mean(x) the
    library's reductions over every dim, .item() a copy to the host; max(x) (no ABI form) still falls
    back. Values, shapes, strides and dtypes as plain CPU torch."""
    got = run_python(f"""
        import json, torch
        from diopi_bindings import device
        device.enable({str(reference_path)!r}, backend="python")
        torch.manual_seed(0)
        x = torch.randn(3, 4).t()
        results = {{}}
        for where in ("cpu", "diopi"):
            d = x.to(where)
            outs = {{"ones_like": torch.ones_like(d), "zeros_like int64": torch.zeros_like(d, dtype=torch.int64),
                     "full_like": torch.full_like(d, 2.5), "sum": d.sum(), "sum float64": d.sum(dtype=torch.float64),
                     "mean": d.mean(), "max": d.max()}}
            results[where] = {{k: [list(v.shape), list(v.stride()), str(v.dtype), v.cpu().double().tolist()]
                              for k, v in outs.items()}}
            results[where]["empty_like"] = [list(torch.empty_like(d).shape), list(torch.empty_like(d).stride())]
            results[where]["item"] = d.sum().item()
        print(json.dumps({{**results, "routed": dict(device.routed_ops()), "fallbacks": dict(device.fallback_ops()),
                          "copies": dict(device.copy_ops())}}))
    """)
    for name, want in got["cpu"].items():
        have = got["diopi"][name]
        if name == "item":
            assert abs(have - want) <= 1e-5 * max(1.0, abs(want))
        elif name == "empty_like":
            assert have == want
        else:
            assert have[:3] == want[:3], name
            have_values, want_values = (torch.tensor(v[3], dtype=torch.float64) for v in (have, want))
            assert torch.allclose(have_values, want_values, rtol=1e-6, atol=1e-6), name
    assert got["routed"]["aten::fill_.Scalar"] >= 3 and got["routed"]["aten::sum"] >= 2
    assert got["routed"]["aten::mean"] == 1
    assert set(got["fallbacks"]) == {"aten::max"}
    assert got["copies"]["aten::_local_scalar_dense"] == 1


def test_an_operator_the_library_lacks_runs_on_the_cpu_logged_once(reference_path):
    got = run_python(f"""
        import json, logging, torch
        logging.basicConfig(level=logging.INFO)
        from diopi_bindings import device
        device.enable({str(reference_path)!r}, backend="python")
        x = torch.linspace(0, 3, 7)
        outs = [torch.tan(x.to("diopi")).cpu() for _ in range(3)]
        ok = all(torch.equal(o, torch.tan(x)) for o in outs)
        print(json.dumps({{"ok": ok, "fallbacks": dict(device.fallback_ops())}}))
    """)
    assert got["ok"]
    assert got["fallbacks"]["aten::tan"] == 3
    assert got["_stderr"].count("aten::tan runs on the CPU (reference-cpu does not implement it)") == 1


TRAIN = """
    import json, torch
    from diopi_bindings import device
    device.enable({library!r}, backend={backend!r})
    from bench.diopi_train import train_tiny
    from ditorch_precision.loss import loss_check
    torch.set_num_threads(1)
    ref, _ = train_tiny("cpu", steps=3, layers=2)
    got, _ = train_tiny("diopi", steps=3, layers=2)
    report = loss_check(got, ref)
    failures = None
    if {autocompare}:
        from ditorch_precision.autocompare import AutoCompare
        with AutoCompare() as ac:
            train_tiny("diopi", steps=1, layers=2)
        failures = [f["op"] for f in ac.failures]
        compared = len(ac.results)
    print(json.dumps({{"passed": report.passed, "mre": report.mre, "ref": ref, "got": got, "failures": failures,
                      "compared": compared if failures is not None else 0,
                      "routed": dict(device.routed_ops()), "fallbacks": dict(device.fallback_ops())}}))
"""


def test_assigning_data_makes_a_parameter_alias_the_new_tensor(reference_path):
    # ZeroAdamW binds every parameter to a view of one flat buffer (p.data = view) and updates the buffer
    got = run_python(f"""
        import json, torch
        from diopi_bindings import device
        device.enable({str(reference_path)!r}, backend="python")
        flat = torch.zeros(6, device="diopi")
        p = torch.nn.Parameter(torch.zeros(2, device="diopi"))
        view = flat[1:3].view_as(p)
        view.copy_(torch.ones(2))
        p.data = view
        flat.add_(1)
        print(json.dumps({{"p": p.detach().cpu().tolist(), "flat": flat.cpu().tolist()}}))
    """)
    assert got["p"] == [2.0, 2.0] and got["flat"] == [1.0, 2.0, 2.0, 1.0, 1.0, 1.0], got


def test_tiny_llama_trains_like_plain_torch(reference_path):
    got = run_python(TRAIN.format(library=str(reference_path), autocompare=True, backend="python"))
    assert got["passed"], (got["ref"], got["got"])
    assert got["mre"] < 1e-5  # the library computes in float64 and rounds once
    assert got["failures"] == [] and got["compared"] > 100  # autocompare: every op against float64 CPU
    # the embedding's weight gradient: heteropp adds the rows into the gradient with an accumulating index_put
    for op in ("aten::mm", "aten::bmm", "aten::embedding", "aten::index_put_", "aten::silu",
               "aten::_softmax_backward_data", "aten::rsqrt"):
        assert op in got["routed"], op
    # Scalar and out= overloads reach the schema's Tensor form; the rotary tables' and the optimizer's
    # operators are in the schema; view helpers are metadata, not fallbacks. (The model's RMSNorm has its own
    # backward: autograd's mean backward, a div.Scalar, no longer runs in this step.)
    for op in ("aten::mul.Scalar", "aten::add.Scalar", "aten::sqrt.out", "aten::addcmul_",
               "aten::addcdiv_", "aten::lerp_.Scalar",
               "aten::cos", "aten::sin", "aten::reciprocal", "aten::log", "aten::slice_backward",
               "aten::_safe_softmax", "aten::ge.Scalar", "aten::lt.Scalar", "aten::bitwise_and.Tensor", "aten::clamp",
               "aten::gather", "aten::index.Tensor", "aten::index_put_"):
        assert op in got["routed"], op
    assert "aten::_unsafe_view" not in got["fallbacks"]
    # The cross-entropy backward's grad[rows, targets] -= ...: lists of optional index tensors.
    assert not {"aten::index.Tensor", "aten::index_put_"} & set(got["fallbacks"])


def test_a_library_missing_functions_still_trains(partial_path):
    got = run_python(TRAIN.format(library=str(partial_path), autocompare=False, backend="python"))
    assert got["passed"], (got["ref"], got["got"])
    for op in PARTIAL_OMITTED:
        assert op in got["fallbacks"] and op not in got["routed"], op
    assert "aten::index_put_" in got["routed"]  # the embedding's weight gradient


def test_privateuse1_claimed_by_another_backend_is_refused(reference_path):
    error = enable_error(str(reference_path), prelude='torch.utils.rename_privateuse1_backend("npu")',
                         backend="python")
    assert error is not None and "PrivateUse1 is already the 'npu' device" in error


def test_the_meta_cache_keys_apart_calls_whose_result_sizes_differ():
    """Calls that share a meta-cache key must get the same result sizes from torch's own meta kernels; a
    float that sets sizes (arange's end, interpolate's scale factors) must be part of the key, a float
    that scales values (alpha, an optimizer's step size) need not be."""
    from diopi_bindings.device.router import _meta_key

    aten = torch.ops.aten
    x, img = torch.randn(3, 4), torch.randn(1, 2, 4, 4)
    calls = [
        (aten.arange.start_step, (0, 1.0, 0.25), {}), (aten.arange.start_step, (0, 2.0, 0.25), {}),
        (aten.upsample_nearest2d.vec, (img, None, [2.0, 2.0]), {}),
        (aten.upsample_nearest2d.vec, (img, None, [3.0, 3.0]), {}),
        (aten.add.Tensor, (x, x), {"alpha": 0.5}), (aten.add.Tensor, (x, x), {"alpha": 0.25}),
        (aten.addcdiv.default, (x, x, x), {"value": -1e-3}), (aten.addcdiv.default, (x, x, x), {"value": -2e-3}),
        (aten.sum.dim_IntList, (x, [0]), {}), (aten.sum.dim_IntList, (x, [1]), {}),
    ]

    def meta_sizes(func, args, kwargs):
        meta = [torch.empty_like(a, device="meta") if isinstance(a, torch.Tensor) else a for a in args]
        return tuple(func(*meta, **kwargs).shape)

    keys = [_meta_key(*c) for c in calls]
    sizes = [meta_sizes(*c) for c in calls]
    assert all(k is not None for k in keys)
    for i in range(len(calls)):
        for j in range(i + 1, len(calls)):
            if keys[i] == keys[j]:
                assert sizes[i] == sizes[j], (calls[i][0], calls[i][1:], calls[j][1:])
    # the optimizer-style floats do share a key (the cache's reason to exist)
    assert keys[4] == keys[5] and keys[6] == keys[7]
