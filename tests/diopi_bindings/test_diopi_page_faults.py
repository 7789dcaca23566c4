"""Fresh memory on the device: a steady training step on "device" (heteropp's tiny LLaMA with AdamW, the
DIOPI-named reference attached) takes no more minor page faults than the same step on plain CPU torch. A
kernel that computes through fresh per-call buffers faults and zeroes new pages on every call (the
reference's double buffers did: ~30x the CPU step's faults); the device's caching allocator and kernels
that read and write tensors in place do not. The count is the kernel's (getrusage), not a clock."""
from __future__ import annotations

from diopi_testlib import run_python


def test_a_steady_device_step_faults_no_more_pages_than_the_cpu_step() -> None:
    got = run_python("""
    import json, resource, torch
    from bench.diopi_train import train_tiny
    from diopi_bindings import deeplink, device
    device.enable(backend="native")
    deeplink.attach(str(deeplink.reference_path()))
    torch.set_num_threads(1)
    faults = {}
    for name in ("cpu", "diopi"):
        train_tiny(name, steps=2, layers=4)  # warm-up: caches filled, shapes met once
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        train_tiny(name, steps=4, layers=4)
        faults[name] = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 4
    print(json.dumps({"faults": faults, "declined": dict(deeplink.fallback_ops())}))
    """)
    faults = got["faults"]
    assert got["declined"] == {}, got["declined"]
    # the CPU step's own count plus a margin for the interpreter's arenas (tens of pages)
    assert faults["diopi"] <= faults["cpu"] + 64, faults
