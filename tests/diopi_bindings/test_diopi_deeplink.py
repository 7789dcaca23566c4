"""A vendor library written against DIOPI as DeepLink defines it (deeplink_vendor/vendor.cpp: opaque handles
read through diopiGetTensor*, scratch from diopiRequireBuffer, tagged scalars, functions named diopiAdd,
diopiAddmm, ...), built here against include/deeplink with no shim, attached to the native device: the ATen
overloads of diopi_functions.yaml it implements run in it (C++ routing), results against plain CPU torch; a
library built for another DIOPI major version, or none, is refused with a message saying so."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from diopi_bindings import gen_dispatch
from diopi_bindings.deeplink import INCLUDE_DIR
from diopi_testlib import run_python

VENDOR_SOURCE = Path(__file__).resolve().parent / "deeplink_vendor" / "vendor.cpp"


def build_vendor(directory: Path, name: str, *defines: str) -> Path:
    compiler = shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        pytest.skip("no C++ compiler")
    out = directory / f"lib{name}.so"
    subprocess.run([compiler, "-std=c++17", "-shared", "-fPIC", "-O1", f"-I{INCLUDE_DIR}", *defines,
                    str(VENDOR_SOURCE), "-o", str(out)], check=True, capture_output=True, text=True)
    return out


@pytest.fixture(scope="module")
def vendor(tmp_path_factory) -> Path:
    return build_vendor(tmp_path_factory.mktemp("deeplink"), "vendor")


ATTACH = """
    import json, torch
    from diopi_bindings import device, deeplink
    device.enable(backend="native")
"""


def test_a_library_written_against_diopi_trains_a_linear_relu_softmax_step(vendor: Path) -> None:
    got = run_python(ATTACH + f"""
    info = deeplink.attach({str(vendor)!r})
    torch.manual_seed(0)
    d = torch.device("diopi")
    lin = torch.nn.Linear(7, 5)
    x = torch.randn(6, 7, requires_grad=True)
    lin_d = torch.nn.Linear(7, 5).to(d)
    lin_d.load_state_dict(lin.state_dict())
    x_d = x.detach().to(d).requires_grad_()
    def step(layer, inp):
        h = torch.nn.functional.silu(layer(inp)).relu()
        loss = (torch.softmax(h, -1) * 3.0).sum()
        loss.backward()
        return h
    h, h_d = step(lin, x), step(lin_d, x_d)
    a, b = torch.randn(3, 4, 5), torch.randn(3, 5, 2)
    o = torch.empty(0, device=d)
    torch.add(a.to(d), 1.5, out=o)  # an out= overload, resized by the router
    cases = {{
        "hidden": (h_d.cpu(), h),
        "x.grad": (x_d.grad.cpu(), x.grad),
        "weight.grad": (lin_d.weight.grad.cpu(), lin.weight.grad),
        "bias.grad": (lin_d.bias.grad.cpu(), lin.bias.grad),
        "bmm": (torch.bmm(a.to(d), b.to(d)).cpu(), torch.bmm(a, b)),
        "add.out": (o.cpu(), a + 1.5),
        "transposed mul": ((a.to(d).transpose(1, 2) * 2).cpu(), a.transpose(1, 2) * 2),
    }}
    errors = {{k: float((g - r).abs().max()) for k, (g, r) in cases.items()}}
    print(json.dumps({{"info": {{k: info[k] for k in ("version", "vendor")}}, "errors": errors,
                      "routed": dict(deeplink.routed_ops()), "declined": dict(deeplink.fallback_ops()),
                      "python_routed": dict(device.routed_ops()), "python_fallbacks": dict(device.fallback_ops())}}))
    """)
    assert got["info"] == {"version": "DIOPI Version: 1.0.0", "vendor": "test-vendor"}
    assert all(err < 1e-5 for err in got["errors"].values()), got["errors"]
    for op in ("aten::addmm", "aten::mm", "aten::silu", "aten::silu_backward", "aten::relu",
               "aten::threshold_backward", "aten::_softmax", "aten::_softmax_backward_data", "aten::bmm",
               "aten::mul.Tensor", "aten::add.out"):
        assert got["routed"].get(op, 0) > 0, (op, got["routed"])
    assert got["declined"] == {}
    # Nothing the vendor implements went through the device's Python router or to the CPU.
    assert not {"aten::addmm", "aten::mm", "aten::relu", "aten::_softmax"} & (
        set(got["python_routed"]) | set(got["python_fallbacks"]))


def test_a_declined_call_runs_on_the_cpu_and_a_failed_one_raises_naming_the_function(vendor: Path) -> None:
    got = run_python(ATTACH + f"""
    deeplink.attach({str(vendor)!r})
    a = torch.randn(4, 6, dtype=torch.float64)
    da = a.to("diopi")
    before = dict(device.copy_ops())
    s64 = da.sum(1)                      # the vendor answers diopiNoImplement for float64
    during = dict(device.copy_ops())
    s32 = a.float().to("diopi").sum(1)   # and computes float32
    try:
        s32 - s32                        # the vendor's diopiSub fails on purpose
        failed = None
    except RuntimeError as exc:
        failed = str(exc).splitlines()[0]
    works = (s32 + s32).cpu().tolist() == (2 * s32).cpu().tolist()
    print(json.dumps({{"failed": failed, "works": works, "err64": float((s64.cpu() - a.sum(1)).abs().max()),
                      "err32": float((s32.cpu() - a.float().sum(1)).abs().max()),
                      "copies": {{k: during.get(k, 0) - before.get(k, 0) for k in during}},
                      "routed": dict(deeplink.routed_ops()), "declined": dict(deeplink.fallback_ops())}}))
    """)
    assert got["err64"] < 1e-12 and got["err32"] < 1e-5
    # the CPU run's operand went to the host and its result back: both counted as the device's copies
    assert got["copies"].get("device to host", 0) >= 1 and got["copies"].get("host to device", 0) >= 1, got["copies"]
    # a call that fails names the DIOPI function, the ATen overload, the code and the library's message
    assert got["failed"] is not None and "diopiSub (aten::sub.Tensor) failed with error 1" in got["failed"]
    assert "sub is broken on purpose" in got["failed"] and got["works"]  # the device keeps working
    assert got["declined"] == {"aten::sum.dim_IntList": 1}
    assert got["routed"]["aten::sum.dim_IntList"] == 1


ATTACH_ERRORS = ATTACH + """
    errors = []
    for path in {paths!r}:  # a refused library registers nothing: the next attach may follow in this process
        try:
            deeplink.attach(path)
            errors.append(None)
        except deeplink.DiopiLoadError as exc:
            errors.append(str(exc))
    print(json.dumps({{"errors": errors}}))
"""


def test_a_library_of_another_diopi_major_version_or_without_a_version_or_missing_is_refused(tmp_path: Path) -> None:
    other = build_vendor(tmp_path, "v2", '-DVENDOR_VERSION="DIOPI Version: 2.0.0"')
    source = tmp_path / "plain.c"
    source.write_text("int diopiAdd(void) { return 0; }\n")
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler")
    plain = tmp_path / "libplain.so"
    subprocess.run([compiler, "-shared", "-fPIC", str(source), "-o", str(plain)], check=True)
    paths = [str(other), str(plain), str(tmp_path / "absent.so")]
    version, unversioned, missing = run_python(ATTACH_ERRORS.format(paths=paths))["errors"]
    assert version is not None and "DIOPI Version: 2.0.0" in version and "DIOPI 1.x" in version, version
    assert unversioned is not None and "not a DIOPI library" in unversioned and "diopiGetVersion" in unversioned
    assert missing is not None and "no such file" in missing


def test_attach_outside_the_native_device_or_twice_is_refused(vendor: Path) -> None:
    got = run_python(f"""
    import json, torch
    from diopi_bindings import device, deeplink
    errors = []
    device.enable(backend="python")
    try:
        deeplink.attach({str(vendor)!r})
    except deeplink.DiopiLoadError as exc:
        errors.append(str(exc))
    print(json.dumps({{"errors": errors}}))
    """)
    assert len(got["errors"]) == 1 and "backend='native'" in got["errors"][0], got
    twice = run_python(ATTACH + f"""
    deeplink.attach({str(vendor)!r})
    try:
        deeplink.attach({str(vendor)!r})
        print(json.dumps({{"error": None}}))
    except deeplink.DiopiLoadError as exc:
        print(json.dumps({{"error": str(exc)}}))
    """)
    assert twice["error"] is not None and "already attached" in twice["error"], twice


@pytest.mark.parametrize("generator", ["gen_dispatch", "gen_reference_bridge"])
def test_the_generated_sources_are_current(generator: str) -> None:
    done = subprocess.run([sys.executable, "-m", f"diopi_bindings.{generator}", "--check"], capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr


def test_every_functional_entry_routes_its_out_overloads() -> None:
    found = {r.aten for r in gen_dispatch.routes(gen_dispatch.TABLE.read_text(),
                                                 gen_dispatch.FUNCTIONS_H.read_text())}
    for overload in ("add.out", "threshold_backward.grad_input", "silu_backward.grad_input", "_softmax.out",
                     "addmm.out", "sum.IntList_out", "mul.Scalar_out"):
        assert overload in found, overload


def test_a_table_entry_that_does_not_fit_its_prototype_is_an_error() -> None:
    functions = gen_dispatch.FUNCTIONS_H.read_text()
    with pytest.raises(gen_dispatch.TableError, match="3 arguments for 4 parameters"):
        gen_dispatch.routes("- aten: mul.Tensor\n  diopi: diopiMul(ctx, out, self)\n", functions)
    with pytest.raises(gen_dispatch.TableError, match="not declared"):
        gen_dispatch.routes("- aten: mul.Tensor\n  diopi: diopiMultiply(ctx, out, self, other)\n", functions)
    with pytest.raises(gen_dispatch.TableError, match="no such ATen overload"):
        gen_dispatch.routes("- aten: mul.Nope\n  diopi: diopiMul(ctx, out, self, other)\n", functions)


# What still reaches the reference through the device's own (Python) router in a LLaMA step: nothing. DIOPI has
# no safe softmax (a fully masked row gives zeros): it is composed in C++ of routed functions (safe_softmax.cpp);
# arange is ATen's composite (empty + arange.start_out, routed in C++); zeros and ones fill through diopiFill.
NOT_DIOPI: set[str] = set()


def test_a_llama_step_with_adamw_runs_in_the_reference_under_diopi_names() -> None:
    got = run_python(ATTACH + """
    from bench.diopi_train import train_tiny
    from ditorch_precision.loss import loss_check
    info = deeplink.attach(deeplink.reference_path())
    torch.set_num_threads(1)
    ref, _ = train_tiny("cpu", steps=3, layers=2)
    got, _ = train_tiny("diopi", steps=3, layers=2)
    report = loss_check(got, ref)
    print(json.dumps({"vendor": info["vendor"], "passed": report.passed, "ref": ref, "got": got,
                      "routed": dict(deeplink.routed_ops()), "declined": dict(deeplink.fallback_ops()),
                      "python_routed": dict(device.routed_ops()), "cpu": dict(device.fallback_ops()),
                      "copies": dict(device.copy_ops())}))
    """, timeout=600)
    assert got["vendor"] == "reference"
    assert got["passed"], (got["ref"], got["got"])
    assert max(abs(a - b) for a, b in zip(got["ref"], got["got"])) < 1e-4
    assert got["cpu"] == {} and got["declined"] == {}, (got["cpu"], got["declined"])
    assert set(got["python_routed"]) <= NOT_DIOPI, set(got["python_routed"]) - NOT_DIOPI
    # forward (embedding, rotary tables, attention, SwiGLU, RMSNorm, loss), backward, and AdamW's update
    for op in ("aten::embedding", "aten::mm", "aten::bmm", "aten::addmm.out", "aten::silu", "aten::silu_backward",
               "aten::_softmax_backward_data", "aten::cos", "aten::sin", "aten::cat", "aten::rsqrt", "aten::gather",
               "aten::_index_put_impl_", "aten::max.dim", "aten::log", "aten::where.self",
               "aten::addcdiv_", "aten::addcmul_", "aten::lerp.Scalar_out", "aten::sqrt.out"):
        assert got["routed"].get(op, 0) > 0, (op, sorted(got["routed"]))
    assert got["copies"]["host to device"] > 0 and got["copies"]["device to host (item)"] == 3


def test_index_add_runs_as_an_accumulating_index_put_and_other_alphas_on_the_cpu() -> None:
    got = run_python(ATTACH + """
    deeplink.attach(deeplink.reference_path())
    torch.manual_seed(0)
    base, src = torch.randn(5, 4, 3), torch.randn(5, 6, 3)
    index = torch.tensor([0, 3, 3, 1, 0, 2])
    d = torch.device("diopi")
    one = base.to(d).index_add_(1, index.to(d), src.to(d))  # repeated rows accumulate
    two = torch.index_add(base.to(d), -2, index.to(d), src.to(d), alpha=2.5)
    print(json.dumps({"one": float((one.cpu() - base.index_add(1, index, src)).abs().max()),
                      "two": float((two.cpu() - base.index_add(-2, index, src, alpha=2.5)).abs().max()),
                      "routed": dict(deeplink.routed_ops()), "declined": dict(deeplink.fallback_ops())}))
    """)
    assert got["one"] < 1e-6 and got["two"] < 1e-6, got
    assert got["routed"] == {"aten::index_add_": 1}, got["routed"]
    assert got["declined"] == {"aten::index_add": 1}, got["declined"]  # alpha 2.5: the CPU


def test_a_transformers_llama_trains_with_torch_adamw_through_diopi() -> None:
    got = run_python(ATTACH + """
    from ditorch_precision.examples.hf_llama import HFLlamaSize, hf_batches, hf_train, make_hf_llama
    deeplink.attach(deeplink.reference_path())
    torch.set_num_threads(1)
    size = HFLlamaSize()
    batches = hf_batches(size, 3)
    curves = {}
    for attn in ("eager", "sdpa"):
        ref = hf_train(make_hf_llama(size, attn=attn), batches)
        got = hf_train(make_hf_llama(size, attn=attn).to("diopi"), [b.to("diopi") for b in batches])
        curves[attn] = max(abs(a - b) for a, b in zip(ref, got))
    x = torch.tensor([[1.0, float("nan"), 3.0], [0.0, 5.0, -1.0]])
    y = torch.tensor([2.0, 2.0, 3.0])
    le = (x.to("diopi") <= y.to("diopi")).cpu().tolist() == (x <= y).tolist()
    print(json.dumps({"curves": curves, "le": le, "routed": dict(deeplink.routed_ops()),
                      "python_routed": dict(device.routed_ops()), "cpu": dict(device.fallback_ops()),
                      "declined": dict(deeplink.fallback_ops())}))
    """, timeout=600)
    assert all(err < 1e-4 for err in got["curves"].values()), got["curves"]
    assert got["le"]
    assert got["cpu"] == {} and got["declined"] == {}, (got["cpu"], got["declined"])
    assert got["python_routed"] == {}, got["python_routed"]
    for op in ("aten::nll_loss_forward", "aten::nll_loss_backward", "aten::le.Tensor", "aten::_log_softmax",
               "aten::_log_softmax_backward_data", "aten::embedding_dense_backward"):
        assert got["routed"].get(op, 0) > 0, (op, sorted(got["routed"]))
