"""The native diopi device's CPU fallback, which is C++ (csrc_diopi/cpu_fallback.cpp): an operator that neither
the DIOPI table nor the library serves runs on the CPU with the same results as plain CPU torch, in its
functional, in-place and out= forms and when it writes a list of tensors; the fallback and its copies are counted
(the copies by reason, and by direction by the device's own counters); and no Python runs per operator once set up.
The device is the native one over host memory (a CPU tensor stands in for device memory); the reference is plain
CPU torch in the same process."""
from __future__ import annotations

from diopi_testlib import run_python

SETUP = """
    import json, sys, torch
    from diopi_bindings import device, deeplink
    device.enable(backend="native")
    deeplink.attach(deeplink.reference_path())
    d = torch.device("diopi")

    def delta(fn):
        before_ops, before_copies = device.fallback_ops(), device.copy_ops()
        result = fn()
        ops = {k: v - before_ops.get(k, 0) for k, v in device.fallback_ops().items() if v != before_ops.get(k, 0)}
        after = device.copy_ops()
        copies = {k: after[k] - before_copies.get(k, 0) for k in after if after[k] != before_copies.get(k, 0)}
        return result, ops, copies
"""

# logit is in neither the DIOPI table nor the reference: each form reaches the device's fallback.
LOGIT = SETUP + """
    torch.manual_seed(0)
    x = torch.rand(3, 5) * 0.8 + 0.1
    functional, ops_f, copies_f = delta(lambda: torch.logit(x.to(d)))
    dx = x.to(d)
    inplace, ops_i, copies_i = delta(lambda: dx.logit_(0.25))
    dout = torch.empty(0, device=d)
    out, ops_o, copies_o = delta(lambda: torch.logit(x.to(d), out=dout))
    ref_inplace = x.clone().logit_(0.25)
    print(json.dumps({
        "equal": [torch.equal(functional.cpu(), torch.logit(x)), torch.equal(dx.cpu(), ref_inplace),
                  torch.equal(dout.cpu(), torch.logit(x)), inplace is dx, out is dout,
                  functional.device.type == "diopi"],
        "ops": [ops_f, ops_i, ops_o], "copies": [copies_f, copies_i, copies_o]}))
"""


def test_an_operator_nobody_serves_runs_on_the_cpu_in_each_form_with_every_copy_counted() -> None:
    got = run_python(LOGIT)
    assert got["equal"] == [True] * 6, got["equal"]
    assert got["ops"] == [{"aten::logit": 1}, {"aten::logit_": 1}, {"aten::logit.out": 1}], got["ops"]
    functional, inplace, out = got["copies"]
    # delta() counts the x.to(d) inside the functional and out= calls as a copy too: one more "host to device".
    assert functional == {"fallback to host": 1, "device to host": 1, "fallback to device": 1, "host to device": 2}
    # in place: self to the host and back; the written-back copy is counted by reason too
    assert inplace == {"fallback to host": 1, "device to host": 1, "fallback to device": 1, "host to device": 1}
    # out= of 0 elements moves no bytes to the host; resized, it is written back
    assert out == {"fallback to host": 1, "device to host": 1, "fallback to device": 1, "host to device": 2}


def test_a_written_list_of_tensors_is_copied_back() -> None:
    # The gradient scaler's unscale: a list of gradients scaled in place and a flag written, both on the device.
    got = run_python(SETUP + """
    grads = [torch.tensor([1.0, 2.0, 4.0]), torch.tensor([[8.0, float("inf")], [0.5, -2.0]])]
    found, scale = torch.zeros(1), torch.tensor([0.25])
    dgrads, dfound = [g.to(d) for g in grads], found.to(d)
    _, ops, copies = delta(lambda: torch._amp_foreach_non_finite_check_and_unscale_(dgrads, dfound, scale.to(d)))
    torch._amp_foreach_non_finite_check_and_unscale_(grads, found, scale)
    print(json.dumps({"equal": [torch.equal(a.cpu(), b) for a, b in zip(dgrads, grads)]
                      + [torch.equal(dfound.cpu(), found)], "ops": ops, "copies": copies}))
    """)
    assert got["equal"] == [True, True, True], got["equal"]
    assert got["ops"] == {"aten::_amp_foreach_non_finite_check_and_unscale_": 1}
    assert got["copies"]["fallback to host"] == 4 and got["copies"]["fallback to device"] == 3, got["copies"]


def test_no_python_runs_per_operator_once_set_up() -> None:
    got = run_python(SETUP + """
    torch.manual_seed(0)
    x = torch.rand(4, 6) * 0.8 + 0.1
    dx, dout = x.to(d), torch.empty(4, 6, device=d)

    def step():
        torch.logit(dx)
        dx.clone().logit_(0.25)
        torch.logit(dx, out=dout)
        torch.cumsum(dx, 1)
        dx.unfold(1, 2, 2).sum()  # a view that reaches the fallback, then a routed reduction
        torch.nn.functional.rrelu(dx, training=True)  # random: draws from the device's generator

    step()  # set-up: the first fallback of each operator logs it
    calls = []

    def profile(frame, event, arg):
        if event == "call" and "diopi_bindings" in frame.f_code.co_filename:
            calls.append(frame.f_code.co_name)

    sys.setprofile(profile)
    for _ in range(5):
        step()
    sys.setprofile(None)
    print(json.dumps({"calls": calls[:20], "n": len(calls), "ops": dict(device.fallback_ops())}))
    """)
    assert got["n"] == 0, got["calls"]
    for op in ("aten::logit", "aten::logit_", "aten::logit.out", "aten::cumsum.out", "aten::rrelu_with_noise"):
        assert got["ops"].get(op) == 6, (op, got["ops"])


def test_random_operators_draw_from_the_device_generator_as_the_cpu_does_from_its_own() -> None:
    got = run_python(SETUP + """
    x = torch.randn(64)
    torch.manual_seed(3)  # seeds the CPU's and the device's default generators alike
    on_device = [torch.nn.functional.rrelu(x.to(d), training=True).cpu() for _ in range(2)]
    torch.manual_seed(3)
    on_cpu = [torch.nn.functional.rrelu(x, training=True) for _ in range(2)]
    g = torch.Generator(device=d).manual_seed(5)
    noise = torch.empty(64, device=d)
    explicit = torch.ops.aten.rrelu_with_noise(x.to(d), noise, 0.1, 0.3, True, g).cpu()
    cpu_noise = torch.empty(64)
    reference = torch.ops.aten.rrelu_with_noise(x, cpu_noise, 0.1, 0.3, True, torch.Generator().manual_seed(5))
    print(json.dumps({"default": [torch.equal(a, b) for a, b in zip(on_device, on_cpu)],
                      "streams_differ": not torch.equal(on_device[0], on_device[1]),
                      "explicit": torch.equal(explicit, reference), "noise": torch.equal(noise.cpu(), cpu_noise)}))
    """)
    assert got == {"default": [True, True], "streams_differ": True, "explicit": True, "noise": True,
                   "_stderr": got["_stderr"]}, got


def test_a_call_the_library_declines_runs_through_the_same_fallback() -> None:
    # int8 has no DIOPI code: the own-ABI reference's add declines it, and the router hands the call to the C++
    # fallback; every written-back result is counted.
    got = run_python("""
    import json, torch
    from diopi_bindings import device
    device.enable(backend="native")
    a = torch.arange(6, dtype=torch.int8).reshape(2, 3)
    d, o = a.to("diopi"), torch.empty(0, dtype=torch.int8, device="diopi")
    before = device.copy_ops()
    r = d + d
    d.add_(d)
    torch.add(r, r, out=o)
    after = device.copy_ops()
    print(json.dumps({"equal": [torch.equal(r.cpu(), a + a), torch.equal(d.cpu(), a + a), torch.equal(o.cpu(), 4 * a)],
                      "ops": dict(device.fallback_ops()),
                      "back": after["fallback to device"] - before.get("fallback to device", 0)}))
    """)
    assert got["equal"] == [True, True, True]
    assert got["ops"] == {"aten::add.out": 3} and got["back"] == 3, got


def test_a_random_call_the_library_declines_runs_on_the_cpu_from_the_device_generator() -> None:
    # The DIOPI-named reference declines float16 draws and dropout outside training: the route has locked the
    # device generator for the call, and the fallback lends that same generator to the CPU (it hung before: the
    # generator's mutex taken twice by one thread).
    got = run_python(SETUP + """
    torch.manual_seed(7)  # seeds the CPU's and the device's default generators alike
    ones = torch.ones(64, dtype=torch.float16)
    on_device = [torch.empty(64, dtype=torch.float16, device=d).normal_().cpu(),
                 torch.empty(64, dtype=torch.float16, device=d).uniform_(-1, 1).cpu(),
                 *[t.cpu() for t in torch.ops.aten.native_dropout(ones.to(d), 0.5, True)],
                 *[t.cpu() for t in torch.ops.aten.native_dropout(ones.to(d), 0.5, False)]]
    torch.manual_seed(7)
    on_cpu = [torch.empty(64, dtype=torch.float16).normal_(), torch.empty(64, dtype=torch.float16).uniform_(-1, 1),
              *torch.ops.aten.native_dropout(ones, 0.5, True), *torch.ops.aten.native_dropout(ones, 0.5, False)]
    print(json.dumps({"equal": [torch.equal(a, b) for a, b in zip(on_device, on_cpu)],
                      "declined": dict(deeplink.fallback_ops())}))
    """, timeout=120)
    assert got["equal"] == [True] * 6, got["equal"]
    assert got["declined"] == {"aten::normal_": 1, "aten::uniform_": 1, "aten::native_dropout": 2}, got["declined"]


def test_an_operator_that_fails_on_the_cpu_is_named_and_writes_nothing() -> None:
    # logit into an int64 out= fails in the CPU kernel: the error is torch's own, with the operator and the fallback
    # named; the caller's out= keeps its values.
    got = run_python(SETUP + """
    x = torch.rand(3, 4)

    def error(out):
        try:
            torch.logit(x.to(out.device), out=out)
        except RuntimeError as exc:
            return str(exc)

    out = torch.full((3, 4), 7, dtype=torch.int64, device=d)
    print(json.dumps({"device": error(out), "cpu": error(torch.full((3, 4), 7, dtype=torch.int64)),
                      "kept": torch.equal(out.cpu(), torch.full((3, 4), 7))}))
    """)
    assert got["cpu"] and got["cpu"].splitlines()[0] in got["device"], got
    assert "aten::logit.out" in got["device"] and "on the CPU" in got["device"], got["device"]
    assert got["kept"]


def test_a_failing_random_operator_leaves_the_cpu_generator_as_it_was() -> None:
    # A seeded operator without a generator argument (another namespace's) draws from the CPU's default generator,
    # which the fallback lends the device generator's state for the call; when its CPU kernel raises, the CPU's own
    # state must come back all the same (before, the CPU generator kept the device's state and the failed draws).
    got = run_python(SETUP + """
    lib = torch.library.Library("diopi_fallback_test", "DEF")
    lib.define("noisy(Tensor x) -> Tensor", tags=(torch.Tag.nondeterministic_seeded,))

    def noisy(x):
        torch.rand(16)
        raise ValueError("noisy refuses")

    lib.impl("noisy", noisy, "CPU")
    torch.manual_seed(11)
    expected = torch.rand(4)
    torch.manual_seed(11)
    try:
        torch.ops.diopi_fallback_test.noisy(torch.ones(3, device=d))
        raised = ""
    except ValueError as exc:
        raised = str(exc)
    print(json.dumps({"raised": raised, "cpu_stream_kept": torch.equal(torch.rand(4), expected)}))
    """)
    assert "noisy refuses" in got["raised"], got
    assert got["cpu_stream_kept"], got


def test_an_out_argument_the_operator_resizes_gets_the_cpu_layout() -> None:
    # An out= of the wrong shape is resized by the operator, with the layout of its inputs (a transposed input, a
    # transposed out); on the device the same strides as on the CPU.
    got = run_python(SETUP + """
    x = torch.rand(3, 4)
    layouts = []
    for out_shape in ((0,), (5,)):
        outs = [torch.empty(out_shape, device=d), torch.empty(out_shape)]
        for out in outs:
            torch.atan2(x.to(out.device).t(), x.to(out.device).t(), out=out)
        layouts.append([list(outs[0].stride()), list(outs[1].stride()), torch.equal(outs[0].cpu(), outs[1])])
    print(json.dumps({"layouts": layouts, "ops": dict(device.fallback_ops())}))
    """)
    for device_stride, cpu_stride, equal in got["layouts"]:
        assert device_stride == cpu_stride and equal, got["layouts"]
    assert got["ops"] == {"aten::atan2.out": 2}, got["ops"]


def test_a_python_number_in_a_declined_call_promotes_as_on_the_cpu() -> None:
    # int8 has no DIOPI code: the reference declines these calls and they run on the CPU. The Python number must
    # reach the CPU as the number it was (before, the route had cast it to int8: int8 + 2.5 gave int8 + 2).
    got = run_python(SETUP + """
    a = torch.arange(-3, 3, dtype=torch.int8)

    def run(f, x):
        try:
            r = f(x)
            return [str(r.dtype), r.cpu().tolist()]
        except RuntimeError:  # int8 += 2.5: refused (by the meta kernel on the device, the CPU kernel on the CPU)
            return "error"

    cases = [lambda t: t + 2.5, lambda t: t * 1.5, lambda t: 2.5 - t, lambda t: t + 3, lambda t: t.clone().add_(2.5),
             lambda t: torch.where(t > 0, t, 1.5)]
    print(json.dumps({"device": [run(f, a.to(d)) for f in cases], "cpu": [run(f, a) for f in cases],
                      "declined": sum(deeplink.fallback_ops().values())}))
    """)
    assert got["device"] == got["cpu"], (got["device"], got["cpu"])
    assert got["declined"] >= 4, got["declined"]


def test_an_out_argument_the_operator_only_writes_is_not_copied_to_the_host() -> None:
    # An out= that no input shares memory with is only written: the CPU kernel gets a fresh host tensor of its
    # layout, and only the inputs travel to the host. int8 is declined by the own-ABI reference, whose router
    # hands the fallback the out= form with an out it allocated.
    got = run_python(SETUP + """
    torch.manual_seed(0)
    x = torch.rand(3, 5) * 0.8 + 0.1
    dx, dout = x.to(d), torch.full((5, 3), 7.0, device=d).t()
    _, _, logit = delta(lambda: torch.logit(dx, out=dout))
    a = torch.arange(6, dtype=torch.int8).reshape(2, 3)
    da = a.to(d)
    r, _, add = delta(lambda: da + da)
    print(json.dumps({"equal": [torch.equal(dout.cpu(), torch.logit(x)), dout.stride() == (1, 3),
                                torch.equal(r.cpu(), a + a)], "copies": [logit, add]}))
    """)
    assert got["equal"] == [True, True, True], got["equal"]
    # before: the out= went to the host too (2 copies there, 2 device-to-host)
    assert got["copies"][0] == {"fallback to host": 1, "device to host": 1, "fallback to device": 1,
                                "host to device": 1}, got["copies"]
    assert got["copies"][1]["fallback to host"] == 1 and got["copies"][1]["device to host"] == 1, got["copies"]


def test_views_of_one_storage_share_one_host_copy_as_on_the_cpu() -> None:
    # Two views of one device storage are one host storage on the CPU, so the CPU kernel sees the aliasing the CPU
    # would: a partial overlap of an input with the written tensor is refused with torch's own error (before, the
    # device computed on independent copies and wrote a result the CPU never gives), disjoint and interleaved views
    # compute as on the CPU, and overlapping inputs travel to the host as one copy.
    got = run_python(SETUP + """
    torch.manual_seed(0)
    base = torch.rand(12) * 0.8 + 0.1
    cases = {
        "logit(x[:-1], out=x[1:])": lambda x: torch.logit(x[:-1], out=x[1:]),
        "cumsum(x[:-1], out=x[1:])": lambda x: torch.cumsum(x[:-1], 0, out=x[1:]),
        "logit(x[:6], out=x[6:])": lambda x: torch.logit(x[:6], out=x[6:]),
        "x[:6].hypot_(x[6:])": lambda x: x[:6].hypot_(x[6:]),
        "x[::2].hypot_(x[1::2])": lambda x: x[::2].hypot_(x[1::2]),
        "rows of a matrix": lambda x: x.view(3, 4)[:, :2].hypot_(x.view(3, 4)[:, 2:]),
        "hypot(x[:6], x[3:9])": lambda x: torch.hypot(x[:6], x[3:9], out=torch.empty(6, device=x.device)),
    }
    results, copies = {}, {}
    for name, case in cases.items():
        outcome = []
        for dev in ("cpu", d):
            x = base.clone().to(dev)
            try:
                _, _, moved = delta(lambda: case(x))
                outcome.append(x.cpu().tolist())
                if dev == d:
                    copies[name] = moved.get("fallback to host", 0)
            except RuntimeError as exc:  # the device's message adds that the fallback ran it
                outcome.append(str(exc).splitlines()[0].split(" (diopi: ")[0])
        results[name] = outcome[0] == outcome[1] or outcome
    print(json.dumps({"results": results, "copies": copies}))
    """)
    assert all(same is True for same in got["results"].values()), got["results"]
    # one host copy per call: the written disjoint view is not copied, overlapping inputs go as one span
    assert got["copies"] == {"logit(x[:6], out=x[6:])": 1, "x[:6].hypot_(x[6:])": 2, "x[::2].hypot_(x[1::2])": 1,
                             "rows of a matrix": 1, "hypot(x[:6], x[3:9])": 1}, got["copies"]
