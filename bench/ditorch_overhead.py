"""Per-call overhead of the ditorch shim against plain torch, measured side by side in one run.

Two workloads: a tensor factory call, and a training step (forward, loss, backward, AdamW) of a
small MLP. Plain and shim blocks alternate so that machine noise hits both alike; the table shows
the median time per call of each, and their ratio.

    python -m bench.ditorch_overhead [--json FILE] [--rounds N] [--threads T]
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Callable

import torch

import ditorch


@dataclass
class Row:
    workload: str
    plain_us: float
    shim_us: float
    ratio: float
    overhead_pct: float


def _block(fn: Callable[[], object], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def compare(name: str, plain: Callable[[], object], shim: Callable[[], object], calls: int, rounds: int,
            strategy: str = "patch") -> Row:
    """Median per-call microseconds of ``plain`` (ditorch off) and ``shim`` (ditorch on), interleaved."""
    plain_t, shim_t = [], []
    for fn, on in ((plain, False), (shim, True)):  # warm-up, both paths
        ditorch.enable(strategy=strategy) if on else ditorch.disable()
        _block(fn, calls)
    for _ in range(rounds):
        ditorch.disable()
        plain_t.append(_block(plain, calls))
        ditorch.enable(strategy=strategy)
        shim_t.append(_block(shim, calls))
    ditorch.disable()
    p, s = statistics.median(plain_t), statistics.median(shim_t)
    return Row(name, p, s, s / p, (s / p - 1) * 100)


def training_step(width: int, depth: int, batch: int, device: str) -> Callable[[], object]:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(width, 1))
    was_on = ditorch.is_enabled()
    ditorch.enable()  # the model is built on "device" like user code would
    model.to(device)
    x = torch.randn(batch, width, device=device)
    y = torch.randn(batch, 1, device=device)
    if not was_on:
        ditorch.disable()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> object:
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    return step


def run(rounds: int) -> list[Row]:
    real = str(ditorch.device_obj())
    ones = torch.ones(64)
    rows = []
    for strategy in ("patch", "mode"):
        rows += [
            compare(f"[{strategy}] factory torch.empty(64, device=...)", lambda: torch.empty(64, device=real),
                    lambda: torch.empty(64, device="device"), 2000, rounds, strategy),
            compare(f"[{strategy}] add x + x (no device argument)", lambda: ones + ones,
                    lambda: ones + ones, 2000, rounds, strategy),
        ]
        for label, width, depth, batch in (("small MLP 512x4, b64", 512, 4, 64), ("tiny MLP 64x2, b16", 64, 2, 16)):
            plain_step = training_step(width, depth, batch, real)
            shim_step = training_step(width, depth, batch, "device")
            calls = 5 if width >= 512 else 50
            rows.append(compare(f"[{strategy}] train step, {label}", plain_step, shim_step, calls, rounds, strategy))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--rounds", type=int, default=15, help="alternating plain/shim blocks per workload")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (fewer is steadier)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    ditorch.disable()
    rows = run(args.rounds)
    machine = f"{platform.machine()}, {platform.processor() or 'cpu'}, torch {torch.__version__}, " \
              f"vendor {ditorch.device.vendor}, {args.threads} thread(s)"
    print(f"ditorch overhead ({machine}; medians of {args.rounds} interleaved blocks)")
    print(f"{'workload':44s} {'plain us':>10s} {'shim us':>10s} {'ratio':>7s} {'overhead':>9s}")
    for r in rows:
        print(f"{r.workload:44s} {r.plain_us:10.2f} {r.shim_us:10.2f} {r.ratio:7.3f} {r.overhead_pct:8.2f}%")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine, "rounds": args.rounds, "rows": [asdict(r) for r in rows]}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
