"""The DIOPI-named reference's float32 matrix products (reference/deeplink/fast_matmul.cpp, float32
accumulation) on the device, against float64 CPU torch on the same inputs: row-major, transposed and strided
operands, a broadcast bias, batches, and an out= that is also an input (autograd accumulating a gradient:
the product goes to scratch first).
The bound is the conformance rule's for a product of length k in float32 (2 k u_acc on the sum of |terms|)."""
from __future__ import annotations

from diopi_testlib import run_python


def test_float32_products_match_float64_within_the_reduction_bound() -> None:
    got = run_python("""
    import json, torch
    from diopi_bindings import device, deeplink
    device.enable(backend="native")
    deeplink.attach(str(deeplink.reference_path()))
    d = torch.device("diopi")
    torch.manual_seed(0)
    u = 2.0 ** -24
    errors = {}

    def check(name, got, exact, terms, k):  # |got - exact| <= 2 k u sum|terms| + one rounding of the result
        bound = 2 * k * u * terms + 2 * u * exact.abs()
        errors[name] = float(((got.double().cpu() - exact).abs() / bound.clamp_min(1e-30)).max())

    a, b = torch.randn(37, 300), torch.randn(300, 129)
    check("mm", a.to(d) @ b.to(d), a.double() @ b.double(), a.double().abs() @ b.double().abs(), 300)
    bt = torch.randn(129, 300)
    check("mm transposed", a.to(d) @ bt.to(d).t(), a.double() @ bt.double().t(),
          a.double().abs() @ bt.double().t().abs(), 300)
    at = torch.randn(300, 37)
    check("mm strided", at.to(d).t()[:, ::2] @ b.to(d)[::2], at.double().t()[:, ::2] @ b.double()[::2],
          at.double().t()[:, ::2].abs() @ b.double()[::2].abs(), 150)
    x, w, bias = torch.randn(64, 300), torch.randn(129, 300), torch.randn(129)
    y = torch.nn.functional.linear(x.to(d), w.to(d), bias.to(d))  # addmm with a broadcast bias
    exact = x.double() @ w.double().t() + bias.double()
    check("linear", y, exact, x.double().abs() @ w.double().t().abs() + bias.double().abs(), 301)
    p, q = torch.randn(5, 33, 70), torch.randn(5, 70, 20)
    check("bmm", torch.bmm(p.to(d), q.to(d)), torch.bmm(p.double(), q.double()),
          torch.bmm(p.double().abs(), q.double().abs()), 70)
    c, m1, m2 = torch.randn(37, 29), torch.randn(37, 50), torch.randn(50, 29)
    dc = c.to(d)
    torch.addmm(dc, m1.to(d), m2.to(d), beta=0.5, out=dc)  # out is the bias input
    exact = 0.5 * c.double() + m1.double() @ m2.double()
    check("addmm out=input", dc, exact, 0.5 * c.double().abs() + m1.double().abs() @ m2.double().abs(), 51)
    print(json.dumps({"errors": errors, "declined": dict(deeplink.fallback_ops()),
                      "routed": dict(deeplink.routed_ops())}))
    """)
    assert all(e <= 1.0 for e in got["errors"].values()), got["errors"]
    assert got["declined"] == {}, got["declined"]
    assert {"aten::mm", "aten::addmm", "aten::bmm", "aten::addmm.out"} <= set(got["routed"]), got["routed"]
