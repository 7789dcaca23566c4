"""aten::_safe_softmax on the DIOPI route (csrc_diopi/safe_softmax.cpp: softmax, the row maximum, a comparison
and where, each a routed DIOPI function; no Python per call) against ATen's own _safe_softmax on the CPU: ordinary
rows, rows whose every element is -inf (zeros), a row with a NaN (NaN), a partly masked row, along either
dimension, float32 and float64, and its gradient."""
from __future__ import annotations

from diopi_testlib import run_python


def test_safe_softmax_matches_aten_and_runs_in_the_library() -> None:
    got = run_python("""
    import json, torch
    from diopi_bindings import device, deeplink
    device.enable(backend="native")
    deeplink.attach(str(deeplink.reference_path()))
    inf, nan = float("inf"), float("nan")
    x = torch.tensor([[1.0, 2.0, 3.0, 0.5], [-inf, -inf, -inf, -inf], [1.0, nan, 0.0, 2.0], [-inf, 0.0, -inf, 1.0]])
    errors = {}
    for dtype in (torch.float32, torch.float64):
        for dim in (-1, 0):
            ref = torch.ops.aten._safe_softmax(x.to(dtype), dim)
            out = torch.ops.aten._safe_softmax(x.to(dtype).to("diopi"), dim).cpu()
            same_nan = torch.equal(out.isnan(), ref.isnan())
            errors[f"{dtype} dim {dim}"] = float((out - ref).nan_to_num().abs().max()) if same_nan else 1.0
    w = torch.randn(3, 5)
    w[1] = -inf
    a = w.clone().requires_grad_()
    b = w.clone().to("diopi").requires_grad_()
    torch.ops.aten._safe_softmax(a, -1).mul(torch.arange(5.0)).sum().backward()
    torch.ops.aten._safe_softmax(b, -1).mul(torch.arange(5.0).to("diopi")).sum().backward()
    errors["grad"] = float((b.grad.cpu() - a.grad).abs().max())
    print(json.dumps({"errors": errors, "python_routed": dict(device.routed_ops()),
                      "routed": dict(deeplink.routed_ops()), "cpu": dict(device.fallback_ops())}))
    """)
    assert all(e < 1e-6 for e in got["errors"].values()), got["errors"]
    assert got["routed"].get("aten::_safe_softmax", 0) == 5, got["routed"]
    assert "aten::_safe_softmax" not in got["python_routed"] and got["cpu"] == {}, got
