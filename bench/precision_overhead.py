"""Overhead of each precision tool on one training step of the small LLaMA-style model, against
the plain step. Prints a table; --json FILE writes the numbers.

    python -m bench.precision_overhead [--steps 3] [--threads 1] [--json out.json]"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time

import torch

from precision import AutoCompare, Capture, OpTimer, OverflowCheck, Selector
from precision.examples.tiny_llama import LlamaConfig, batches, make_model, train_step

CFG = LlamaConfig(vocab=512, dim=256, layers=2, heads=8, hidden=688, seq=128, batch=4)
TARGETS = {"capture(layers.1.mlp)": 1.5, "overflow_check": 1.5, "autocompare(all ops)": 5.0}


def _step_times(make_tool, steps: int) -> list[float]:
    model = make_model(CFG)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = batches(CFG, steps + 1)
    train_step(model, opt, *data[0])  # warm-up, outside the tool
    times = []
    tool = make_tool()
    with tool if tool is not None else _nothing():
        for x, y in data[1:]:
            t0 = time.perf_counter()
            train_step(model, opt, x, y)
            times.append(time.perf_counter() - t0)
    return times


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    p.add_argument("--json", metavar="FILE")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    tmp = tempfile.mkdtemp(prefix="precision-bench-")
    tools = {
        "plain": lambda: None,
        "capture(layers.1.mlp)": lambda: Capture(f"{tmp}/cap", Selector.build(modules="layers.1.mlp")),
        "overflow_check": lambda: OverflowCheck(),
        "op_timer": lambda: OpTimer(),
        "autocompare(all ops)": lambda: AutoCompare(),
    }
    rows = {}
    for name, make in tools.items():
        rows[name] = statistics.median(_step_times(make, a.steps))
        print(f"{name:<24} {rows[name] * 1e3:9.1f} ms  {rows[name] / rows['plain']:5.2f}x", flush=True)
    result = {"machine": f"{platform.machine()} {platform.processor() or ''}".strip(), "torch": torch.__version__,
              "threads": torch.get_num_threads(), "config": vars(CFG), "steps": a.steps,
              "step_ms": {k: v * 1e3 for k, v in rows.items()},
              "overhead": {k: v / rows["plain"] for k, v in rows.items()},
              "targets": TARGETS}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
