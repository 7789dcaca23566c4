"""Two builds of the reference library compared on heteropp's tiny LLaMA training step (AdamW) on the diopi
device, the reference attached under DIOPI's names, each against the plain CPU step of the same process.

``python -m bench.diopi_reference_ab BUILD_A BUILD_B [--runs 3] [--layers 8] [--steps 5] [--json FILE]``: each
BUILD is a folder holding ``libdiopi_reference.so`` and ``libdiopi_reference_deeplink.so`` (a cmake build of
``diopi_bindings/reference``). Runs alternate A, B, A, B, ... in fresh processes (one device per process), so a
load spike meets both; each run trains 2 warm-up steps and then ``--steps`` steps on the CPU and on the device
(one intra-op thread), and reports the medians of wall and process CPU time per step. The table lists, per run,
the device's CPU time per step and its ratio to the CPU step's, with the load average.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

LIBRARIES = ("libdiopi_reference.so", "libdiopi_reference_deeplink.so")


def _child(build: str, layers: int, steps: int) -> dict:
    import torch

    from bench.diopi_train import cpu_seconds, train_tiny
    from diopi_bindings import deeplink, device

    # the device's own library first: the DIOPI-named one links it by soname and so binds to this copy
    device.enable(str(Path(build) / LIBRARIES[0]), backend="native")
    deeplink.attach(str(Path(build) / LIBRARIES[1]))
    torch.set_num_threads(1)
    out = {}
    for where in ("cpu", "diopi"):
        _, wall = train_tiny(where, steps + 2, layers)
        out[where] = {"wall_s": statistics.median(wall[2:]), "cpu_s": statistics.median(cpu_seconds[2:])}
    out["fallbacks"] = dict(deeplink.fallback_ops()) | dict(device.fallback_ops())
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("builds", nargs=2, metavar="BUILD")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--json", metavar="FILE")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.child, args.layers, args.steps)))
        return 0
    for build in args.builds:
        missing = [name for name in LIBRARIES if not (Path(build) / name).is_file()]
        if missing:
            p.exit(2, f"diopi_reference_ab: error: {build} has no {', '.join(missing)} (a cmake build folder of "
                      "diopi_bindings/reference is expected)\n")
    if args.runs < 1 or args.steps < 1 or args.layers < 1:
        p.exit(2, "diopi_reference_ab: error: --runs, --steps and --layers must be at least 1\n")
    rows = []
    for run in range(args.runs):
        for label, build in zip("AB", args.builds):
            t = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "bench.diopi_reference_ab", *args.builds, "--child", build,
                                   "--layers", str(args.layers), "--steps", str(args.steps)],
                                  capture_output=True, text=True, check=False)
            if done.returncode != 0:
                print(done.stderr[-2000:], file=sys.stderr)
                return 1
            got = json.loads(done.stdout.strip().splitlines()[-1])
            got.update(build=label, run=run, load_average=os.getloadavg()[0], seconds=time.perf_counter() - t)
            rows.append(got)
            print(f"run {run} {label}: device {got['diopi']['cpu_s']:.4f} s CPU/step ({got['diopi']['wall_s']:.4f} "
                  f"wall), plain CPU {got['cpu']['cpu_s']:.4f} ({got['cpu']['wall_s']:.4f}), CPU-time ratio "
                  f"{got['diopi']['cpu_s'] / got['cpu']['cpu_s']:.2f}x, wall ratio "
                  f"{got['diopi']['wall_s'] / got['cpu']['wall_s']:.2f}x, load {got['load_average']:.1f}"
                  + (f", fallbacks {got['fallbacks']}" if got["fallbacks"] else ""), flush=True)
    for label in "AB":
        mine = [r for r in rows if r["build"] == label]
        print(f"{label}: median CPU-time ratio "
              f"{statistics.median(r['diopi']['cpu_s'] / r['cpu']['cpu_s'] for r in mine):.2f}x, median device "
              f"step {statistics.median(r['diopi']['cpu_s'] for r in mine):.4f} s CPU")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
