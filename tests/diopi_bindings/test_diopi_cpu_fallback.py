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
