"""Boolean-mask indexing on the native device with the reference library attached under DIOPI names: x[mask],
masked_select, x[mask] = v, accumulating index_put and the backward of x[mask]. The result's shape depends on the
mask's values, so torch's meta kernel cannot give it; each result is compared bit-equal with plain CPU torch
(CPU tensors stand in for device memory), and the indexing itself is served by the library."""
from __future__ import annotations

from diopi_testlib import run_python

CASES = """
    import json, torch
    from diopi_bindings import device, deeplink
    device.enable(backend="native")
    deeplink.attach(deeplink.reference_path())
    d = torch.device("diopi")
    torch.manual_seed(0)
    x = torch.randn(4, 5, 3)
    m2 = x[:, :, 0] > 0  # a mask over the first two dims
    m1 = torch.tensor([True, False, True, True, False])  # over dim 1
    none = torch.zeros(4, dtype=torch.bool)

    def put(t, mask, values, accumulate=False):
        return t.clone().index_put_((mask,), values, accumulate=accumulate)

    def grad_of_masked_sum(t, mask):
        t = t.clone().requires_grad_()
        (t[mask] * torch.arange(1.0, 4.0, device=t.device)).sum().backward()
        return t.grad

    cases = {
        "x[2-d mask]": lambda t, dev: t[m2.to(dev)],
        "x[:, 1-d mask]": lambda t, dev: t[:, m1.to(dev)],
        "x[all-false mask]": lambda t, dev: t[none.to(dev)],
        "x[1-d mask, long index]": lambda t, dev: t[none.logical_not().to(dev), torch.tensor([4, 0, 2, 2]).to(dev)],
        "masked_select, broadcast": lambda t, dev: torch.masked_select(t, (t[:1] > 0.5).to(dev)),
        "x[mask] = v": lambda t, dev: put(t, m2.to(dev), torch.tensor([1.5, -2.0, 3.0]).to(dev)),
        "x[mask] += v (accumulate)": lambda t, dev: put(t, m2.to(dev), torch.tensor(0.5).to(dev), accumulate=True),
        "x[cpu mask]": lambda t, dev: t[m2],
        "backward of x[mask]": lambda t, dev: grad_of_masked_sum(t, m2.to(dev)),
    }
    results = {}
    for name, case in cases.items():
        want = case(x, "cpu")
        try:
            got = case(x.to(d), d).cpu()
            results[name] = torch.equal(got, want) and got.shape == want.shape or f"{got} != {want}"
        except Exception as exc:  # noqa: BLE001 - reported by name
            results[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    wrong = torch.zeros(3, dtype=torch.bool)
    errors = []
    for dev in ("cpu", d):
        try:
            x.to(dev)[wrong.to(dev)]
        except IndexError as exc:
            errors.append(str(exc).splitlines()[0])
    print(json.dumps({"results": results, "errors": errors, "routed": dict(deeplink.routed_ops()),
                      "declined": dict(deeplink.fallback_ops()), "cpu": dict(device.fallback_ops())}))
"""


def test_boolean_mask_indexing_on_the_device_equals_the_cpu_and_runs_in_the_library() -> None:
    got = run_python(CASES)
    assert all(ok is True for ok in got["results"].values()), got["results"]
    # a mask of the wrong shape: torch's own IndexError, word for word
    assert len(got["errors"]) == 2 and got["errors"][0] == got["errors"][1], got["errors"]
    assert "The shape of the mask [3] at index 0 does not match" in got["errors"][0], got["errors"]
    assert got["routed"].get("aten::index.Tensor", 0) >= 6, got["routed"]
    assert got["routed"].get("aten::_index_put_impl_", 0) >= 3, got["routed"]
    assert "aten::index.Tensor" not in got["declined"] and "aten::_index_put_impl_" not in got["declined"], got
    assert not any("index" in op for op in got["cpu"]), got["cpu"]
