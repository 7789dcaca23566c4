"""The reference's dense float32 loops (reference/dense_float.cpp: silu, silu_backward, max over the last dim,
built for x86-64-v3 and the baseline) on the device with the DIOPI-named reference attached, against float64
CPU torch on the same inputs, and against the reference's own strided loops on the same values in another
layout: a layout never changes a result's bits. silu_backward's exp is float32 arithmetic (fast_exp.h) with
1 - s taken as e s: within 2 units of its magnitude |g| (s + |x| s (1 - s)) wherever e = exp(-x) is finite
in float32 (x > -88.72); below, where the true gradient is under 3e-37 |g|, it is 0. max.dim is exact (values
and first indices, a NaN winning, ties, infinities)."""
from __future__ import annotations

from diopi_testlib import run_python


def test_dense_float32_kernels_match_float64_torch_and_their_strided_layouts() -> None:
    got = run_python("""
    import json, torch
    from diopi_bindings import device, deeplink
    device.enable(backend="native")
    deeplink.attach(str(deeplink.reference_path()))
    d = torch.device("diopi")
    torch.manual_seed(0)
    out = {}

    x = torch.cat([torch.linspace(-88.7, 88.7, 4001), 4 * torch.randn(4000), torch.tensor([0.0, -0.0, 1e-30])])
    x = x[torch.randperm(x.numel())].reshape(87, 92)
    g = torch.randn(87, 92)
    X, G = x.double(), g.double()
    S = torch.sigmoid(X)
    exact = torch.ops.aten.silu_backward(G, X)
    dense = torch.ops.aten.silu_backward(g.to(d), x.to(d)).cpu()
    magnitude = G.abs() * (S + X.abs() * S * (1 - S))
    units = (dense.double() - exact).abs() / (torch.finfo(torch.float32).eps * magnitude).clamp_min(1e-45)
    out["silu_backward units"] = float(units.max())
    # the same values transposed in memory: the strided loop
    strided = torch.ops.aten.silu_backward(g.t().contiguous().to(d).t(), x.t().contiguous().to(d).t()).cpu()
    out["silu_backward layouts equal"] = torch.equal(dense, strided)
    far = torch.tensor([-88.8, -95.0, -103.0, -120.0, -float("inf")])
    tail = torch.ops.aten.silu_backward(torch.ones(5).to(d), far.to(d)).cpu()
    out["silu_backward tail"] = [float(v) for v in tail]
    out["silu units"] = float(((torch.nn.functional.silu(x.to(d)).cpu().double() - X * S).abs()
                               / (torch.finfo(torch.float32).eps * (X * S).abs()).clamp_min(1e-45)).max())
    out["silu layouts equal"] = torch.equal(torch.nn.functional.silu(x.to(d)).cpu(),
                                            torch.nn.functional.silu(x.t().contiguous().to(d).t()).cpu())

    m = torch.randn(40, 257)
    m[1, 7] = m[1, 100] = float("nan")
    m[2] = 3.0                          # ties: the first index
    m[3, 50] = float("inf")
    m[4] = -float("inf")
    m[5, 0] = float("nan")
    values, indices = m.to(d).max(-1)
    rv, ri = m.max(-1)
    out["max values equal"] = torch.equal(values.cpu().nan_to_num(), rv.nan_to_num())
    out["max nan rows"] = values.cpu().isnan().nonzero().flatten().tolist()
    out["max indices equal"] = torch.equal(indices.cpu(), ri)
    tv, ti = m.t().contiguous().to(d).t().max(-1)
    out["max layouts equal"] = torch.equal(tv.cpu().nan_to_num(), values.cpu().nan_to_num()) and torch.equal(
        ti.cpu(), indices.cpu())
    print(json.dumps(out))
    """)
    assert got["silu_backward units"] <= 2.0, got
    assert got["silu units"] <= 2.0, got
    assert got["silu_backward layouts equal"] and got["silu layouts equal"], got
    # beyond the float32 exp's range: 0 (the true values are 1e-37 and less), and -inf is NaN as in torch
    assert got["silu_backward tail"][1:4] == [0.0, 0.0, 0.0] and abs(got["silu_backward tail"][0]) < 3e-37, got
    assert got["silu_backward tail"][4] != got["silu_backward tail"][4], got
    assert got["max values equal"] and got["max indices equal"] and got["max layouts equal"], got
    assert got["max nan rows"] == [1, 5], got
