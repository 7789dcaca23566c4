"""Per-call cost of an operator that falls back to the CPU on the diopi device (the library lacks it).

``python -m bench.diopi_fallback [--rounds 7] [--calls 2000] [--size 16] [--json FILE]``: the native device with
the reference under DIOPI's names attached (the training configuration); ``logit`` (in neither the table nor the
library) in its functional, in-place and ``out=`` forms on the device, against the same call on the CPU.
Each round times ``--calls`` calls; the table gives the medians over rounds of wall time and of the process's
CPU time per call, and the load average when it ran.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Callable

import torch


def _per_call(fn: Callable[[], object], calls: int) -> tuple[float, float]:
    """(wall us, CPU us) per call."""
    w0, c0 = time.perf_counter(), time.process_time()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - w0) / calls * 1e6, (time.process_time() - c0) / calls * 1e6


def workloads(size: int) -> dict[str, tuple[Callable[[], object], Callable[[], object]]]:
    """name -> (the CPU call, the same call on the device)."""
    x = torch.rand(size) * 0.8 + 0.1
    out, inplace = torch.empty(size), x.clone()
    dx, dout, dinplace = x.to("diopi"), out.to("diopi"), inplace.to("diopi")
    return {
        "logit(x)": (lambda: torch.logit(x), lambda: torch.logit(dx)),
        "x.logit_()": (lambda: inplace.logit_(0.25), lambda: dinplace.logit_(0.25)),  # eps keeps it finite
        "logit(x, out=)": (lambda: torch.logit(x, out=out), lambda: torch.logit(dx, out=dout)),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--size", type=int, default=16, help="elements per tensor")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.calls < 1 or args.size < 1:
        parser.error("--rounds, --calls and --size must be at least 1")
    from diopi_bindings import deeplink, device

    torch.set_num_threads(1)
    device.enable(backend="native")
    deeplink.attach(deeplink.reference_path())
    rows = {}
    for name, (cpu, dev) in workloads(args.size).items():
        cpu(), dev()  # the first call logs the fallback and fills caches
        samples = {"cpu": [], "device": []}
        for _ in range(args.rounds):  # alternated, so a load change hits both
            samples["cpu"].append(_per_call(cpu, args.calls))
            samples["device"].append(_per_call(dev, args.calls))
        rows[name] = {side: {"wall_us": statistics.median(s[0] for s in v),
                             "cpu_us": statistics.median(s[1] for s in v)} for side, v in samples.items()}
    result = {"rows": rows, "fallbacks": dict(device.fallback_ops()), "load_average": os.getloadavg()[0],
              "rounds": args.rounds, "calls": args.calls, "size": args.size}
    print(f"{'operation':16s} {'device wall':>12s} {'device CPU':>11s} {'CPU wall':>9s} {'CPU CPU':>8s}  (us per call)")
    for name, r in rows.items():
        print(f"{name:16s} {r['device']['wall_us']:12.1f} {r['device']['cpu_us']:11.1f} "
              f"{r['cpu']['wall_us']:9.1f} {r['cpu']['cpu_us']:8.1f}")
    print(f"load average {result['load_average']:.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
