"""Random operators on the native diopi device draw from the device's generators through DIOPI
(diopiNormalInp, diopiUniformInp, diopiDropout with a generator handle; the reference's counter-based
numbers): reproducible from torch.manual_seed and from a saved generator state, one generator per device,
an explicit torch.Generator(device="diopi") honoured. References: the normal and uniform distributions'
CDFs (Kolmogorov-Smirnov distance at a fixed seed), dropout's definition on the same input."""
from __future__ import annotations

from diopi_testlib import run_python


def test_random_operators_draw_from_the_device_generator_through_diopi() -> None:
    got = run_python("""
    import json, math, torch
    import torch.nn.functional as F
    from diopi_bindings import device, deeplink
    device.enable(backend="native")
    deeplink.attach(str(deeplink.reference_path()))
    d, n = torch.device("diopi"), 20000

    def ks(sample, cdf):  # Kolmogorov-Smirnov distance to a continuous CDF
        x, _ = torch.sort(sample.double())
        c = cdf(x)
        i = torch.arange(1, len(x) + 1, dtype=torch.float64)
        return float(torch.maximum(i / len(x) - c, c - (i - 1) / len(x)).max())

    torch.manual_seed(7)
    a = torch.randn(n, device=d).cpu()
    b = torch.randn(n, device=d).cpu()
    torch.manual_seed(7)
    a_again = torch.randn(n, device=d).cpu()
    state = torch.diopi.get_rng_state()
    c = torch.empty(n, device=d).uniform_(-2.0, 3.0).cpu()
    torch.diopi.set_rng_state(state)
    c_again = torch.empty(n, device=d).uniform_(-2.0, 3.0).cpu()
    on_one = torch.randn(n, device="diopi:1").cpu()  # device 1's own generator: seeded, not advanced by device 0
    g = torch.Generator(device=d)
    g.manual_seed(11)
    e1 = torch.randn(64, generator=g, device=d).cpu()
    g.manual_seed(11)
    e2 = torch.randn(64, generator=g, device=d).cpu()
    x = torch.randn(n).abs() + 1.0
    torch.manual_seed(3)
    y = F.dropout(x.to(d), 0.3, training=True).cpu()
    torch.manual_seed(3)
    y_again = F.dropout(x.to(d), 0.3, training=True).cpu()
    kept = y != 0
    normal_cdf = lambda t: 0.5 * (1 + torch.erf(t / math.sqrt(2)))
    print(json.dumps({
        "repeat": torch.equal(a, a_again), "advances": not torch.equal(a, b),
        "ks_normal": ks(a, normal_cdf), "ks_normal_b": ks(b, normal_cdf),
        "ks_uniform": ks(c, lambda t: ((t + 2.0) / 5.0).clamp(0, 1)),
        "uniform_range": [float(c.min()), float(c.max())], "state_restores": torch.equal(c, c_again),
        "device1": torch.equal(on_one, a), "explicit": torch.equal(e1, e2),
        "dropout_repeat": torch.equal(y, y_again), "kept": float(kept.double().mean()),
        "dropout_values": float((y[kept] - x[kept] / 0.7).abs().max()),
        "routed": dict(deeplink.routed_ops()), "declined": dict(deeplink.fallback_ops()),
        "python_routed": dict(device.routed_ops()), "python_fallbacks": dict(device.fallback_ops())}))
    """)
    assert got["repeat"] and got["advances"] and got["state_restores"] and got["explicit"], got
    # 1.95 / sqrt(n): the 0.1% point of the KS distance (fixed seeds: the same numbers every run)
    bound = 1.95 / 20000 ** 0.5
    assert got["ks_normal"] < bound and got["ks_normal_b"] < bound and got["ks_uniform"] < bound, got
    assert -2.0 <= got["uniform_range"][0] and got["uniform_range"][1] < 3.0
    assert got["device1"], "device 1's generator, seeded alike, gives the same stream (not advanced by device 0)"
    assert got["dropout_repeat"] and abs(got["kept"] - 0.7) < 0.02 and got["dropout_values"] < 1e-6, got
    for op in ("aten::normal_", "aten::uniform_", "aten::native_dropout"):
        assert got["routed"].get(op, 0) > 0, (op, got["routed"], got["python_routed"], got["python_fallbacks"])
    assert got["declined"] == {}, got["declined"]
