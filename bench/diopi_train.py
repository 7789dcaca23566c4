"""The tiny LLaMA of heteropp (``make demo``'s model) trained on the diopi device against plain CPU torch.

``python -m bench.diopi_train [--layers 8] [--steps 3] [--library LIB] [--json FILE]`` prints the time
per step on each device, their ratio and the loss check (ditorch_precision.loss) of the two curves.
The diopi device is enabled first: it must exist before the process's first backward pass.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time

import torch


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
    for step in range(1, steps + 1):
        t0 = time.perf_counter()
        batch = global_batch(m, seed, step, sequences).to(device)
        opt.zero_grad()
        loss = model.loss(model(batch[:, :-1]), batch[:, 1:])
        loss.backward()
        opt.step()
        losses.append(loss.item())  # .item() waits for the step
        seconds.append(time.perf_counter() - t0)
    return losses, seconds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.diopi_train", description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--library", help="DIOPI library (default: $DIOPI_LIBRARY, else the reference)")
    ap.add_argument("--json", help="write the numbers here")
    args = ap.parse_args(argv)
    if args.layers < 1 or args.steps < 1:
        ap.error(f"--layers and --steps must be >= 1, got --layers {args.layers} --steps {args.steps}")
    from ditorch_diopi import device
    from ditorch_precision.loss import loss_check

    lib = device.enable(args.library)
    torch.set_num_threads(1)
    cpu_losses, cpu_s = train_tiny("cpu", args.steps, args.layers)
    dev_losses, dev_s = train_tiny("diopi", args.steps, args.layers)
    report = loss_check(dev_losses, cpu_losses)
    cpu_med, dev_med = sorted(cpu_s)[len(cpu_s) // 2], sorted(dev_s)[len(dev_s) // 2]
    out = {"library": f"{lib.vendor} {lib.version}", "layers": args.layers, "steps": args.steps,
           "cpu_step_s": cpu_med, "diopi_step_s": dev_med, "ratio": dev_med / cpu_med,
           "loss_check": report.to_dict(), "routed_ops": len(device.routed_ops()),
           "fallback_ops": dict(device.fallback_ops())}
    print(f"{'device':<8} {'median step s':>14}\ncpu      {cpu_med:14.4f}\ndiopi    {dev_med:14.4f}\n"
          f"ratio diopi/cpu: {out['ratio']:.1f}x; loss check: {'pass' if report.passed else 'FAIL'} "
          f"(mean relative error {report.mre:.2e}); {out['routed_ops']} operators served by {out['library']}, "
          f"{len(out['fallback_ops'])} on the CPU")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0 if report.passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
