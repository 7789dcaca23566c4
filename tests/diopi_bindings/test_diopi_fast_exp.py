"""The reference computes exp for float32/bf16/fp16 tensors in float32 arithmetic (reference/fast_exp.h,
a polynomial after range reduction; the exp in silu, sigmoid and softmax too). Checked on the device (the
DIOPI-named reference attached) against float64 CPU torch over the whole float32 range: every 2^12-th bit
pattern (about a million inputs, both signs, subnormal inputs, NaN payloads, the infinities) and the edges:
overflow at the last finite result, subnormal results, the last input that rounds to a nonzero result.
Bound: 2 units in the last place of the exact result (a subnormal result's unit is 2^-149); NaN stays NaN.
bf16/fp16: within one unit of their own last place (the float32 result rounded once more)."""
from __future__ import annotations

from diopi_testlib import run_python


def test_exp_is_within_two_ulp_of_float64_over_the_float32_range() -> None:
    got = run_python("""
    import json, math, torch
    from diopi_bindings import device, deeplink
    device.enable(backend="native")
    deeplink.attach(str(deeplink.reference_path()))
    d = torch.device("diopi")
    bits = torch.arange(0, 2 ** 32, 2 ** 12, dtype=torch.int64)
    bits = torch.where(bits >= 2 ** 31, bits - 2 ** 32, bits).to(torch.int32)
    edges = torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan, 1e-45, -1e-45, 1e-30, -1e-30, 1.0, -1.0,
                          0.5 * math.log(2), 88.72283172607422, 88.72283935546875, 89.0, 1e30, 3e38, -3e38,
                          -87.33654, -87.3366, -100.0, -103.2789, -103.97207641601562, -103.97208404541016,
                          -104.0, -1e30], dtype=torch.float32)
    x = torch.cat([bits.view(torch.float32), edges])
    got = torch.exp(x.to(d)).cpu().double()
    exact = torch.exp(x.double())
    nan = x.isnan()
    _, e = torch.frexp(exact)
    ulp = torch.ldexp(torch.ones_like(exact), (e - 24).clamp_min(-149))
    overflow = exact.float().isinf()  # the exact result rounds to inf in float32
    err = torch.where(nan | overflow, torch.zeros_like(exact), (got - exact).abs() / ulp)
    worst = {"float32": float(err.max()), "nan kept": bool(got[nan].isnan().all()),
             "inf kept": bool((got[overflow] == math.inf).all()), "overflows": int(overflow.sum())}
    for dtype in (torch.bfloat16, torch.float16):
        y = torch.linspace(-20, 11, 4001).to(dtype)
        g = torch.exp(y.to(d)).cpu()
        r = torch.exp(y.double()).to(dtype)
        info = torch.finfo(dtype)  # a subnormal result's unit: tiny * eps
        unit = (info.eps * r.double().abs()).clamp_min(info.tiny * info.eps)
        worst[str(dtype)] = float(((g.double() - r.double()).abs() / unit).max())
    worst["declined"] = dict(deeplink.fallback_ops())
    print(json.dumps(worst))
    """)
    assert got["declined"] == {}, got["declined"]
    assert got["nan kept"] and got["inf kept"], got
    assert got["float32"] <= 2.0, got
    assert got["torch.bfloat16"] <= 1.0 and got["torch.float16"] <= 1.0, got
