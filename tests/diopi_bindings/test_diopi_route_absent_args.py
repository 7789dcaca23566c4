"""Routed calls whose arguments the router once could not carry to a library written to DeepLink's DIOPI: an
absent Scalar? (torch.clamp(x, min=0): DIOPI's diopiClampScalar takes NULL), an absent bool? (native_dropout's
train: None means training), index.Tensor_out's list of optional device tensors (the meta call), and
embedding_dense_backward.out (torch's meta kernel refuses out=). Run on the native device with the reference
library under DIOPI names, and with deeplink_vendor/vendor.cpp built here (its clamp honours NULL bounds);
each result bit-equal to plain CPU torch (integer-valued floats where the library sums), and served by the
library, not the CPU. Each run is a fresh interpreter (one attached library per process)."""
from __future__ import annotations

from pathlib import Path

from diopi_testlib import run_python
from test_diopi_deeplink import build_vendor

ATTACH = """
    import json, torch
    from diopi_bindings import device, deeplink
    device.enable(backend="native")
    deeplink.attach({library!r})
    d = torch.device("diopi")

    def same(got, want):
        try:
            torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0, equal_nan=True)
            return True
        except (AssertionError, RuntimeError) as exc:
            return str(exc).splitlines()[0]

    x = torch.tensor([-3.5, -1.0, 0.0, 0.25, 2.0, 5.0, float("nan"), float("inf")])
    ints = torch.arange(-6, 7)
    cases = {{
        "clamp(min=0)": (torch.clamp(x.to(d), min=0), torch.clamp(x, min=0)),
        "clamp(max=1)": (torch.clamp(x.to(d), max=1), torch.clamp(x, max=1)),
        "clamp(-1, 1)": (torch.clamp(x.to(d), -1, 1), torch.clamp(x, -1, 1)),
        "clamp.out(min=0)": (torch.clamp(x.to(d), min=0, out=torch.empty(0, device=d)), torch.clamp(x, min=0)),
        "clamp(max=3) of int64": (torch.clamp(ints.to(d), max=3), torch.clamp(ints, max=3)),
    }}
"""

REFERENCE_ONLY = """
    torch.manual_seed(0)
    a = torch.randn(4, 5, 3)
    rows, cols = torch.tensor([2, 0, 3, 2]), torch.tensor([4, 1])
    index_out = lambda t, idx: torch.ops.aten.index.Tensor_out(t, idx, out=torch.empty(0, device=t.device))
    cases["index.Tensor_out [rows]"] = (index_out(a.to(d), [rows.to(d)]), a[rows])
    cases["index.Tensor_out [None, cols]"] = (index_out(a.to(d), [None, cols.to(d)]), a[:, cols])
    cases["index.Tensor_out [rows, rows]"] = (index_out(a.to(d), [rows.to(d), rows.to(d)]), a[rows, rows])
    grad = torch.randint(-8, 9, (2, 3, 6)).float()  # integer-valued: any summation order is exact
    idx = torch.tensor([[1, 4, 1], [6, 1, 0]])
    bwd_out = lambda g, i, pad: torch.ops.aten.embedding_dense_backward.out(
        g, i, 7, pad, False, out=torch.empty(0, device=g.device))
    for pad in (-1, 1):
        cases[f"embedding_dense_backward.out padding_idx={pad}"] = (
            bwd_out(grad.to(d), idx.to(d), pad), torch.ops.aten.embedding_dense_backward(grad, idx, 7, pad, False))
    def refusal(g, i):  # an out= of another dtype than the result's: torch's own kernel refuses it
        try:
            torch.ops.aten.embedding_dense_backward.out(g, i, 7, -1, False, out=torch.empty(0, dtype=torch.float64,
                                                                                            device=g.device))
        except RuntimeError as exc:
            return str(exc).splitlines()[0]
    refused = {"device": refusal(grad.to(d), idx.to(d)), "cpu": refusal(grad, idx)}
    out, mask = torch.ops.aten.native_dropout(a.to(d), 0.0, None)
    want_out, want_mask = torch.ops.aten.native_dropout(a, 0.0, None)
    cases["native_dropout(p=0, train=None)"] = (out, want_out)
    cases["native_dropout(p=0, train=None) mask"] = (mask, want_mask)
"""

REPORT = """
    print(json.dumps({"equal": {k: same(g, w) for k, (g, w) in cases.items()},
                      "routed": dict(deeplink.routed_ops()), "declined": dict(deeplink.fallback_ops()),
                      "refused": globals().get("refused")}))
"""


def test_absent_arguments_and_out_forms_route_to_the_reference_under_diopi_names() -> None:
    from diopi_bindings import deeplink

    got = run_python(ATTACH.format(library=str(deeplink.reference_path())) + REFERENCE_ONLY + REPORT)
    assert all(v is True for v in got["equal"].values()), got["equal"]
    assert got["routed"]["aten::clamp"] == 4 and got["routed"]["aten::clamp.out"] == 1, got["routed"]
    assert got["routed"]["aten::index.Tensor_out"] == 3, got["routed"]
    assert got["routed"]["aten::embedding_dense_backward.out"] == 2, got["routed"]
    assert got["routed"]["aten::native_dropout"] == 1, got["routed"]
    wanted = "expected out tensor to have dtype float, but got double instead"
    assert all(wanted in message.lower() for message in got["refused"].values()), got["refused"]
    assert not got["declined"], got["declined"]


def test_a_vendor_clamp_gets_null_for_an_absent_bound(tmp_path: Path) -> None:
    vendor = build_vendor(tmp_path, "vendor")
    got = run_python(ATTACH.format(library=str(vendor)) + REPORT)
    assert all(v is True for v in got["equal"].values()), got["equal"]
    # float32 computed by the vendor; int64 declined by it (it computes float32/float64 only), run on the CPU
    assert got["routed"]["aten::clamp"] == 3 and got["routed"]["aten::clamp.out"] == 1, got["routed"]
    assert got["declined"] == {"aten::clamp": 1}, got["declined"]


def test_the_only_optional_bool_the_table_routes_is_native_dropouts_train() -> None:
    """Frame::boolean reads None as true, which is native_dropout's meaning (ATen's kernels train when train is
    None); another bool? routed through it would need its own meaning."""
    import re

    import torch

    from diopi_bindings import gen_dispatch

    optional_bools = set()
    for route in gen_dispatch.routes(gen_dispatch.TABLE.read_text(), gen_dispatch.FUNCTIONS_H.read_text()):
        name, _, overload = route.aten.partition(".")
        schema = torch._C._get_schema(f"aten::{name}", overload)
        for position in re.findall(r"f\.boolean\((\d+)\)", " ".join(route.arguments)):
            argument = schema.arguments[int(position)]
            if str(argument.type) == "Optional[bool]":
                optional_bools.add((route.aten, argument.name))
    assert optional_bools == {("native_dropout", "train"), ("native_dropout.out", "train")}
