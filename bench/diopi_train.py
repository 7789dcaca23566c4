"""The tiny LLaMA of heteropp (``make demo``'s model) trained on the diopi device against plain CPU torch.

``python -m bench.diopi_train [--layers 8] [--steps 5] [--backends python,native,diopi] [--library LIB] [--json FILE]``
prints the median time per step on plain CPU torch and on the diopi device for each device backend (the
host-memory device "python", the native PrivateUse1 device "native"; for native also with its caching
allocator off, "uncached"; "diopi": the native device with the reference attached under DIOPI's names, routed
in C++), side by side, with the process's CPU time per step, their ratios to CPU and the loss check
(ditorch_precision.loss) of each device's curve against the CPU's. A backend serves one process, so each runs
in a child process of its own (``--backend X``), plain CPU torch measured in the same child; the diopi device
is enabled first: it must exist before the process's first backward pass.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

# "diopi": the native device with the reference attached under DIOPI's names (deeplink.attach): the C++ route.
BACKENDS = ("python", "native", "diopi")


def train_tiny(device: str, steps: int = 3, layers: int = 2, sequences: int = 4,
               seed: int = 0) -> tuple[list[float], list[float]]:
    """Losses and seconds per step of heteropp's single-process training step (tiny preset) on ``device``."""
    from heteropp.engine.data import global_batch
    from heteropp.engine.optim import ZeroAdamW
    from heteropp.model import StageModel, TPGroup
    from heteropp.spec.model import PRESETS

    m = dataclasses.replace(PRESETS["tiny"], layers=layers)
    model = StageModel(m, range(m.layers), TPGroup(), seed=seed, first=True, last=True).to(device)
    opt = ZeroAdamW(list(model.parameters()), 3e-3)
    losses, seconds = [], []
    cpu_seconds.clear()
    for step in range(1, steps + 1):
        t0, c0 = time.perf_counter(), time.process_time()
        batch = global_batch(m, seed, step, sequences).to(device)
        opt.zero_grad()
        loss = model.loss(model(batch[:, :-1]), batch[:, 1:])
        loss.backward()
        opt.step()
        losses.append(loss.item())  # .item() waits for the step
        seconds.append(time.perf_counter() - t0)
        cpu_seconds.append(time.process_time() - c0)
    return losses, seconds


cpu_seconds: list[float] = []  # the process's CPU time of each step of the last train_tiny


def measure(backend: str, library: str | None, layers: int, steps: int) -> dict:
    """One backend in this process: plain CPU steps, then the same steps on the diopi device."""
    from diopi_bindings import deeplink, device
    from ditorch_precision.loss import loss_check

    lib = device.enable(library, backend="native" if backend == "diopi" else backend)
    if backend == "diopi":
        deeplink.attach(deeplink.reference_path())
    torch.set_num_threads(1)
    cpu_losses, cpu_s = train_tiny("cpu", steps, layers)
    cpu_cpu = statistics.median(cpu_seconds)
    dev_losses, dev_s = train_tiny("diopi", steps, layers)
    dev_cpu = statistics.median(cpu_seconds)
    report = loss_check(dev_losses, cpu_losses)
    cpu_med, dev_med = statistics.median(cpu_s), statistics.median(dev_s)
    fallbacks = dict(device.fallback_ops()) | (dict(deeplink.fallback_ops()) if backend == "diopi" else {})
    routed = len(device.routed_ops()) + (len(deeplink.routed_ops()) if backend == "diopi" else 0)
    out = {"backend": backend, "library": f"{lib.vendor} {lib.version}", "layers": layers,
           "steps": steps, "cpu_step_s": cpu_med, "diopi_step_s": dev_med, "ratio": dev_med / cpu_med,
           "cpu_step_cpu_s": cpu_cpu, "diopi_step_cpu_s": dev_cpu,
           "loss_check": report.to_dict(), "routed_ops": routed,
           "fallback_ops": fallbacks, "load_average": os.getloadavg()[0]}
    if backend == "native":  # the same steps with every free going straight to the library
        torch.diopi.set_caching(False)
        _, uncached_s = train_tiny("diopi", steps, layers)
        torch.diopi.set_caching(True)
        out["diopi_uncached_step_s"] = statistics.median(uncached_s)
    return out


def _in_child(backend: str, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "out.json")
        argv = [sys.executable, "-m", "bench.diopi_train", "--backend", backend, "--layers", str(args.layers),
                "--steps", str(args.steps), "--json", path]
        if args.library:
            argv += ["--library", args.library]
        done = subprocess.run(argv, capture_output=True, text=True)
        if not os.path.exists(path):
            raise SystemExit(f"the {backend} backend's run failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
        with open(path) as f:
            return json.load(f)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.diopi_train", description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated device backends to compare")
    ap.add_argument("--backend", choices=BACKENDS, help=argparse.SUPPRESS)  # one backend, in this process
    ap.add_argument("--library", help="DIOPI library (default: $DIOPI_LIBRARY, else the reference)")
    ap.add_argument("--json", help="write the numbers here")
    args = ap.parse_args(argv)
    if args.layers < 1 or args.steps < 1:
        ap.error(f"--layers and --steps must be >= 1, got --layers {args.layers} --steps {args.steps}")
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = [b for b in backends if b not in BACKENDS]
    if unknown or not backends:
        ap.error(f"--backends takes a comma-separated subset of {', '.join(BACKENDS)}, got {args.backends!r}")
    if args.backend:
        out = measure(args.backend, args.library, args.layers, args.steps)
        runs = [out]
    else:
        runs = [_in_child(b, args) for b in backends]
        out = {"layers": args.layers, "steps": args.steps, "runs": runs}
    print(f"{'backend':<8} {'cpu s/step':>11} {'diopi s/step':>13} {'(CPU time)':>11} {'uncached':>9} {'ratio':>7} "
          f"{'loss MRE':>9} {'library ops':>12} {'CPU ops':>8} {'load':>5}")
    for r in runs:
        uncached = f"{r['diopi_uncached_step_s']:9.4f}" if "diopi_uncached_step_s" in r else f"{'-':>9}"
        print(f"{r['backend']:<8} {r['cpu_step_s']:11.4f} {r['diopi_step_s']:13.4f} {r['diopi_step_cpu_s']:11.4f} "
              f"{uncached} {r['ratio']:6.1f}x {r['loss_check']['mre']:9.1e} {r['routed_ops']:12d} "
              f"{len(r['fallback_ops']):8d} {r['load_average']:5.1f}")
    passed = all(r["loss_check"]["passed"] for r in runs)
    print(f"loss check: {'pass' if passed else 'FAIL'} ({runs[0]['library']}, {args.layers} layers, "
          f"median of {args.steps} steps)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
