"""The reference library's kernels one at a time, on the diopi device (the reference attached under DIOPI's
names, routed in C++) against the same operation in plain CPU torch, at the shapes of heteropp's tiny LLaMA.

``python -m bench.diopi_reference_kernels [--rounds 5] [--calls 300] [--build DIR] [--json FILE]`` prints, per
operation, the median over rounds of the wall and process CPU time per call on the device and on the CPU (one
intra-op thread for both), and their ratio. ``--build``: a cmake build folder of ``diopi_bindings/reference``
to measure instead of the installed reference.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Callable

import torch


def _operations(d: str) -> dict[str, Callable[[], object]]:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(128, 64, generator=g), torch.randn(128, 64, generator=g)
    h = torch.randn(4, 32, 172, generator=g)  # the SwiGLU hidden of 4 sequences of 32 tokens
    q = torch.randn(4, 8, 32, 16, generator=g)
    logits = torch.randn(128, 256, generator=g)
    mask = torch.rand(32, 32, generator=g) > 0.5
    xd, yd, hd, qd, ld, md = (t.to(d) for t in (x, y, h, q, logits, mask))
    return {
        "silu [4, 32, 172]": lambda: torch.nn.functional.silu(hd),
        "silu_backward [4, 32, 172]": lambda: torch.ops.aten.silu_backward(hd, hd),
        "mul [128, 64]": lambda: xd * yd,
        "add [128, 64]": lambda: xd + yd,
        "sqrt [128, 64]": lambda: xd.abs().sqrt(),
        "max.dim [128, 256]": lambda: ld.max(-1),
        "cat halves [4, 8, 32, 16]": lambda: torch.cat((-qd[..., 8:], qd[..., :8]), -1),
        "where [32, 32]": lambda: torch.where(md, xd[:32, :32], yd[:32, :32]),
        "tril [32, 32]": lambda: torch.tril(xd[:32, :32]),
        "gt scalar [128, 64]": lambda: xd > 0.5,
    }


def _time(fn: Callable[[], object], calls: int) -> tuple[float, float]:
    fn()
    t, c = time.perf_counter(), time.process_time()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t) / calls, (time.process_time() - c) / calls


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--build", metavar="DIR", help="a build folder with libdiopi_reference(_deeplink).so")
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.calls < 1:
        p.error("--rounds and --calls must be at least 1")
    from diopi_bindings import deeplink, device

    if args.build:  # the device's library first: the DIOPI-named one links it by soname, so binds to this copy
        device.enable(f"{args.build}/libdiopi_reference.so", backend="native")
        deeplink.attach(f"{args.build}/libdiopi_reference_deeplink.so")
    else:
        device.enable(backend="native")
        deeplink.attach(deeplink.reference_path())
    torch.set_num_threads(1)
    on = {"cpu": _operations("cpu"), "diopi": _operations("diopi")}
    rows = {}
    for name in on["cpu"]:
        samples: dict[str, list[tuple[float, float]]] = {"cpu": [], "diopi": []}
        for _ in range(args.rounds):  # alternated, so a load spike meets both
            for where in ("cpu", "diopi"):
                samples[where].append(_time(on[where][name], args.calls))
        rows[name] = {where: {"wall_us": 1e6 * statistics.median(s[0] for s in v),
                              "cpu_us": 1e6 * statistics.median(s[1] for s in v)} for where, v in samples.items()}
    print(f"{'operation':<28} {'device us (CPU)':>18} {'torch us (CPU)':>18} {'ratio':>6}")
    for name, r in rows.items():
        dev, cpu = r["diopi"], r["cpu"]
        print(f"{name:<28} {dev['wall_us']:>8.1f} ({dev['cpu_us']:>6.1f}) "
              f"{cpu['wall_us']:>9.1f} ({cpu['cpu_us']:>6.1f}) "
              f"{dev['cpu_us'] / max(cpu['cpu_us'], 1e-9):>5.1f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
