"""The own-ABI library's operators (``diopi_aten_<name>``) on the native diopi device are routed in C++
(csrc_diopi/own_router.cpp): functional, in-place and out= forms, out= overloads named after their output, Python
numbers, outputs the library allocates (nonzero), boolean-mask indices and the calls the library declines (the C++
CPU fallback), with no Python per operator once set up. The device is the native one over the reference
library's device memory (host memory standing in for a device); the reference is plain CPU torch in the same
process."""
from __future__ import annotations

from diopi_testlib import run_python

# Each entry: a name, then a function of (tensor maker, device) whose CPU and device runs are compared.
STEP = """
    import json, sys, torch
    from diopi_bindings import device
    device.enable(backend="native")
    d = torch.device("diopi")
    torch.manual_seed(0)
    a, b = torch.randn(4, 6), torch.randn(4, 6)
    m = torch.randn(6, 3)
    target = torch.tensor([0, 2, 1, 5])
    i8 = torch.arange(-6, 6, dtype=torch.int8).reshape(2, 6)

    def cases(t):
        x, y, w, tg, small = t(a), t(b), t(m), t(target), t(i8)
        out, out_t = t(torch.empty(4, 6)), t(torch.empty(6, 4)).t()
        c = x.clone()
        c.add_(y, alpha=0.5)
        c.mul_(1.5)
        z = x.clone()
        z.zero_()
        f = x.clone().fill_(2.25)
        logp = torch.log_softmax(x, 1)
        loss, total = torch.ops.aten.nll_loss_forward(logp, tg, None, 1, -100)
        gi = torch.empty_like(x)
        torch.ops.aten.gelu_backward.grad_input(y, x, approximate="tanh", grad_input=gi)
        values, indices = torch.max(x, 1)
        return {
            "add": x + y, "add number": x + 2.5, "add alpha": torch.add(x, y, alpha=-2),
            "add out": torch.add(x, y, out=out), "add out transposed": torch.add(x, y, out=out_t),
            "in place": c, "zero_": z, "fill_": f, "mul number": x * 3, "div int": x / 2,
            "silu": torch.nn.functional.silu(x), "mm": x @ w, "softmax": torch.softmax(x, 1),
            "sum": x.sum(1), "mean": x.mean(), "max values": values, "max indices": indices,
            "nll_loss_forward": loss, "total_weight": total, "gelu_backward.grad_input": gi,
            "where": torch.where(x > 0, x, y), "cat": torch.cat([x, y], 0), "nonzero": torch.nonzero(x > 0.5),
            "mask index": x[x > 0], "masked_select": torch.masked_select(x, y > 0),
            "embedding": torch.nn.functional.embedding(tg, x.t().contiguous()),
            "int8 add (declined)": small + small, "clamp": x.clamp(min=-0.5),
        }

    def step():
        return cases(lambda v: v.to(d))
"""

NO_PYTHON = STEP + """
    want = cases(lambda v: v)
    got = step()  # set-up: the first call of each operator (its log line, if it falls back)
    bad = [k for k in want if got[k].dtype != want[k].dtype or got[k].device.type != "diopi"
           or not torch.allclose(got[k].cpu().double(), want[k].double(), rtol=1e-6, atol=1e-6)]
    calls = []

    def profile(frame, event, arg):
        if event == "call" and "diopi_bindings" in frame.f_code.co_filename:
            calls.append(frame.f_code.co_name)

    before = dict(device.fallback_ops())
    sys.setprofile(profile)
    for _ in range(3):
        step()
    sys.setprofile(None)
    fallbacks = {k: v - before.get(k, 0) for k, v in device.fallback_ops().items() if v != before.get(k, 0)}
    print(json.dumps({"bad": bad, "calls": sorted(set(calls))[:30], "n": len(calls), "fallbacks": fallbacks,
                      "routed": dict(device.routed_ops())}))
"""


def test_no_python_runs_per_operator_of_the_own_abi_library() -> None:
    got = run_python(NO_PYTHON)
    assert got["bad"] == [], got["bad"]
    assert got["n"] == 0, got["calls"]
    # On the CPU: the int8 add (int8 has no code in the own ABI; add reaches a backend as add.out), once per step,
    # and x > 0 (the reference has no gt), four per step.
    assert got["fallbacks"] == {"aten::add.out": 3, "aten::gt.Scalar_out": 12}, got["fallbacks"]
    # Each form reaches the library: structured operators as their out= form (add_ and a + b are add.out), out=
    # overloads named after their output, outputs the library allocates, the composites (masked_select, the mask
    # index as nonzero + index).
    for op in ("aten::add.out", "aten::mul.out", "aten::fill_.Scalar", "aten::nll_loss_forward.output",
               "aten::gelu_backward.grad_input", "aten::max.dim_max", "aten::nonzero", "aten::index.Tensor_out",
               "aten::masked_select", "aten::mm.out", "aten::cat.out", "aten::embedding", "aten::where.self"):
        assert got["routed"].get(op, 0) >= 3, (op, got["routed"])


def test_the_call_table_is_generated_from_the_schema() -> None:
    # The C++ trampolines (csrc_diopi/own_calls.gen.cpp) are generated from diopi_bindings/schema.py.
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "diopi_bindings.gen_own_calls", "--check"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr


# A vendor library on the native device: one device whose memory is malloc'd and tracked, and a neg that takes
# scratch memory from the context (it must be this device's memory), refuses more than 4 elements with
# DIOPI_ERR_NOT_IMPLEMENTED and a message, and gives the scratch back.
REFUSING_C = r"""
#include <stdlib.h>
#include <string.h>
#include "diopi/functions.h"
static const char* last = "";
uint32_t diopi_abi_version(void) { return DIOPI_ABI_VERSION; }
const char* diopi_vendor_name(void) { return "refusing"; }
const char* diopi_impl_version(void) { return "1.0"; }
const char* diopi_last_error(void) { return last; }
enum { SLOTS = 4096 };
static char* blocks[SLOTS];
static int64_t sizes[SLOTS];
static int on_device(const void* p, int64_t n) {
    for (int i = 0; i < SLOTS; ++i)
        if (blocks[i] && (const char*)p >= blocks[i] && (const char*)p + n <= blocks[i] + sizes[i]) return 1;
    return 0;
}
diopiError_t diopi_device_count(int32_t* count) { *count = 1; return DIOPI_SUCCESS; }
diopiError_t diopi_set_device(int32_t d) { return d == 0 ? DIOPI_SUCCESS : DIOPI_ERR_INVALID_ARGUMENT; }
diopiError_t diopi_get_device(int32_t* d) { *d = 0; return DIOPI_SUCCESS; }
diopiError_t diopi_device_malloc(int32_t d, int64_t n, void** p) {
    for (int i = 0; i < SLOTS; ++i) {
        if (blocks[i]) continue;
        blocks[i] = malloc(n > 0 ? n : 1);
        sizes[i] = n;
        *p = blocks[i];
        return blocks[i] ? DIOPI_SUCCESS : DIOPI_ERR_ALLOCATION;
    }
    return DIOPI_ERR_ALLOCATION;
}
diopiError_t diopi_device_free(int32_t d, void* p) {
    for (int i = 0; i < SLOTS; ++i) if (blocks[i] == p) { free(p); blocks[i] = 0; return DIOPI_SUCCESS; }
    return DIOPI_ERR_INVALID_ARGUMENT;
}
diopiError_t diopi_memcpy_h2d(int32_t d, void* dst, const void* src, int64_t n) { memcpy(dst, src, n); return 0; }
diopiError_t diopi_memcpy_d2h(int32_t d, void* dst, const void* src, int64_t n) { memcpy(dst, src, n); return 0; }
diopiError_t diopi_memcpy_d2d(int32_t dd, void* dst, int32_t sd, const void* src, int64_t n) {
    memmove(dst, src, n);
    return 0;
}
diopiError_t diopi_device_synchronize(int32_t d) { return DIOPI_SUCCESS; }
diopiError_t diopi_aten_neg(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t self) {
    int64_t n = 1;
    for (int64_t i = 0; i < self->ndim; ++i) n *= self->shape[i];
    if (n > 4) { last = "more than 4 elements"; return DIOPI_ERR_NOT_IMPLEMENTED; }
    if (self->dtype != DIOPI_DTYPE_FLOAT32 || out->dtype != DIOPI_DTYPE_FLOAT32) {
        last = "float32 only";
        return DIOPI_ERR_DTYPE;
    }
    float* scratch = ctx->allocate(ctx->allocator_state, n * (int64_t)sizeof(float));
    if (!scratch) { last = "no scratch"; return DIOPI_ERR_ALLOCATION; }
    if (!on_device(scratch, n * (int64_t)sizeof(float))) {
        last = "scratch is not device memory";
        return DIOPI_ERR_INTERNAL;
    }
    for (int64_t i = 0; i < n; ++i) scratch[i] = -((const float*)self->data)[i];
    memcpy(out->data, scratch, n * sizeof(float));
    ctx->release(ctx->allocator_state, scratch);
    return DIOPI_SUCCESS;
}
"""


def test_a_refused_call_runs_on_the_cpu_logged_once_with_the_library_s_reason(tmp_path) -> None:
    from diopi_testlib import compile_c_library

    lib = compile_c_library(tmp_path, "refusing", REFUSING_C)
    got = run_python(f"""
        import json, logging, torch
        logging.basicConfig(level=logging.INFO)
        from diopi_bindings import device
        device.enable({str(lib)!r}, backend="native")
        small, large = torch.randn(4), torch.randn(3, 3)
        equal = [torch.equal((-small.to("diopi")).cpu(), -small)]
        equal += [torch.equal((-large.to("diopi")).cpu(), -large) for _ in range(2)]
        print(json.dumps({{"equal": equal, "routed": dict(device.routed_ops()),
                          "fallbacks": dict(device.fallback_ops())}}))
    """)
    assert got["equal"] == [True, True, True]
    # The small one in the library, with its scratch in device memory; the large ones on the CPU, logged once.
    assert got["routed"] == {"aten::neg.out": 1}, (got["routed"], got["_stderr"][-2000:])
    assert got["fallbacks"] == {"aten::neg.out": 2}, got["fallbacks"]
    line = "aten::neg.out runs on the CPU (aten::neg failed (not implemented): more than 4 elements)"
    assert got["_stderr"].count(line) == 1, got["_stderr"][-2000:]


def test_threads_calling_at_once_get_their_own_results_and_every_call_is_counted() -> None:
    # The routes run without the GIL: four threads at once, each with its own shapes, served and declined calls.
    got = run_python("""
    import json, threading, torch
    from diopi_bindings import device
    device.enable(backend="native")
    d = torch.device("diopi")
    bad = []

    def work(k):
        x = torch.randn(k + 2, 3)
        small = torch.arange(-k, k + 3, dtype=torch.int8)
        dx, ds = x.to(d), small.to(d)
        for _ in range(200):
            if not torch.equal((dx * dx + dx).cpu(), x * x + x) or not torch.equal((ds + ds).cpu(), small + small):
                bad.append(k)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    routed, fallbacks = device.routed_ops(), device.fallback_ops()
    print(json.dumps({"bad": bad, "mul": routed["aten::mul.out"], "add": routed["aten::add.out"],
                      "declined": fallbacks["aten::add.out"]}))
    """)
    assert got["bad"] == []
    assert (got["mul"], got["add"], got["declined"]) == (800, 800, 800), got


def test_every_out_overload_of_a_served_operator_has_a_route() -> None:
    # For each schema operator the reference implements, ATen's out= overloads (its inputs plus written out
    # arguments, one per result) are found from torch's own schemas. Each has a PrivateUse1 kernel (its route),
    # or ATen's own out= composite (relu.out: the functional operator, whose route serves it, then a copy); none
    # reaches the CPU fallback.
    got = run_python("""
    import json, torch
    from diopi_bindings import device
    from diopi_bindings.schema import OPS
    lib = device.enable(backend="native")
    checked, missing, composite = [], [], []
    for op in OPS:
        if not op.aten.startswith("aten::") or not lib.implements(op.aten):
            continue
        name, _, overload = op.aten.removeprefix("aten::").partition(".")
        functional = getattr(getattr(torch.ops.aten, name), overload or "default")._schema
        inputs = [(a.name, str(a.type)) for a in functional.arguments]
        for schema in torch._C._jit_get_schemas_for_operator(f"aten::{name}"):
            outs = [a for a in schema.arguments if a.is_out]
            if outs and len(outs) == len(functional.returns) and \\
                    [(a.name, str(a.type)) for a in schema.arguments if not a.is_out] == inputs:
                full = f"aten::{name}.{schema.overload_name}"
                checked.append(full)
                if torch._C._dispatch_has_kernel_for_dispatch_key(full, "CompositeExplicitAutograd"):
                    composite.append(full)
                elif not torch._C._dispatch_has_kernel_for_dispatch_key(full, "PrivateUse1"):
                    missing.append(full)
    x = torch.randn(5).to("diopi")
    before = dict(device.fallback_ops())
    out = torch.empty(5, device="diopi")
    same = torch.equal(torch.ops.aten.relu.out(x, out=out).cpu(), torch.relu(x.cpu()))
    print(json.dumps({"checked": checked, "missing": missing, "composite": composite, "relu.out": same,
                      "fallbacks": {k: v for k, v in device.fallback_ops().items() if v != before.get(k, 0)}}))
    """)
    assert got["missing"] == [], got["missing"]
    assert got["relu.out"] and got["fallbacks"] == {}, got
    assert {"aten::add.out", "aten::nll_loss_forward.output", "aten::gelu_backward.grad_input",
            "aten::max.dim_max", "aten::nonzero.out"} <= set(got["checked"]), got["checked"]


def test_a_plan_with_an_unknown_argument_kind_is_refused_when_registered() -> None:
    # A plan names each ABI argument's kind (schema.py's); one the routes cannot read is an error at set-up, naming
    # it, not a route that registers and fails at its first call.
    got = run_python("""
    import json, torch
    from diopi_bindings import _C_diopi, device
    from diopi_bindings.device import native
    device.enable(backend="native")
    plan = native._router.route_plan(torch.ops.aten.add.Tensor)
    kind, *rest = plan["args"][1]
    plan["args"][1] = ("tensor", *rest)
    try:
        _C_diopi.drop_own_routes(_C_diopi.register_own_routes([plan], 0, lambda *a: None))
        error = None
    except RuntimeError as e:
        error = str(e)
    x = torch.randn(3)
    print(json.dumps({"kind": kind, "error": error, "add": torch.equal((x.to("diopi") + x.to("diopi")).cpu(), x + x)}))
    """)
    assert got["kind"] == "in", got
    assert got["error"] is not None and "unknown ABI argument kind 'tensor'" in got["error"], got["error"]
    assert got["add"], got  # the routes registered before are untouched
