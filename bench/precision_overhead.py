"""Overhead of each precision tool on one AdamW training step of a HuggingFace LlamaForCausalLM
(random weights, 2 layers, hidden 256, sequence 128, batch 4), against the plain step. The plain
step and the tools are measured side by side: every round runs each of them for --steps steps (a
tool's entry and exit included), in a rotated order, on the same model, so a change in machine load
hits all of them alike. Quoted: the median over rounds of each one's
mean step time, and the median over rounds of its ratio to the plain step of the same round; the
same for the process's CPU time, which a loaded machine disturbs less than wall time. --json FILE
writes the numbers.

    python -m bench.precision_overhead [--rounds 5] [--steps 2] [--threads 1] [--only overflow_check]
                                       [--model bench|small] [--json out.json]
    python -m bench.precision_overhead --compare [--rounds 3] [--steps 2] [--model small]

--model small: the tests' 2-layer LlamaForCausalLM (hidden 32, sequence 8, batch 2), whose step is
all per-op overhead.

--compare: the cost of ``compare_dumps`` on two captures of every op of --steps honest steps (the
same model and data twice, per-op files and bulk parts), streamed (``on_row``, as precision-diff
compare runs it): each compare in a process of its own, so its CPU time and peak resident memory
are its own; op pairs per second of CPU time; the peak of a process that only imports the package
beside it."""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import torch

from ditorch_precision import AutoCompare, Capture, OpTimer, OverflowCheck, Selector
from ditorch_precision.tool import Tool
from ditorch_precision.examples.hf_llama import HFLlamaSize, hf_batches, hf_train_step, make_hf_llama

MODELS = {"bench": HFLlamaSize(vocab=512, hidden=256, intermediate=688, layers=2, heads=8, kv_heads=8, seq=128,
                               batch=4),
          "small": HFLlamaSize()}
CFG = MODELS["bench"]
MLP = "model.layers.1.mlp"
TARGETS = {f"capture({MLP})": 1.5, f"capture({MLP}, bulk)": 1.5, "overflow_check": 1.5,
           "capture(all ops, bulk)": 2.0, "capture(all ops, stats)": 1.2,
           "autocompare(all ops)": 5.0}


def tools(tmp: str) -> dict:
    return {
        "plain": lambda r: None,
        "dispatch mode only": lambda r: Tool(),  # every tool's floor: the mode, module and step tracking
        f"capture({MLP})": lambda r: Capture(f"{tmp}/cap{r}", Selector.build(modules=MLP), bulk=False),
        f"capture({MLP}, bulk)": lambda r: Capture(f"{tmp}/bulk{r}", Selector.build(modules=MLP), bulk=True),
        # hook="auto": the C++ op observer where the package's C++ module is built (see meta.json's "hook")
        "capture(all ops, stats)": lambda r: Capture(f"{tmp}/stats{r}", mode="stats"),
        "capture(all ops, stats, python hook)": lambda r: Capture(f"{tmp}/statspy{r}", mode="stats", hook="python"),
        "capture(all ops)": lambda r: Capture(f"{tmp}/all{r}", max_bytes=None, bulk=False),
        # hook="auto" again: the C++ op observer (tensors kept in C++, part files written by its thread)
        "capture(all ops, bulk)": lambda r: Capture(f"{tmp}/allbulk{r}", max_bytes=None, bulk=True),
        # the same through the Python dispatch mode
        "capture(all ops, bulk, python hook)": lambda r: Capture(f"{tmp}/allbulkpy{r}", max_bytes=None, bulk=True,
                                                                 hook="python"),
        # the per-op path alone (index lines with argument signatures, no tensors saved): what a
        # full capture costs apart from keeping and writing the tensors
        "capture(all ops, index only)": lambda r: Capture(f"{tmp}/index{r}", max_bytes=None, save_tensors=False),
        "capture(all ops, bulk, no background)": lambda r: Capture(f"{tmp}/allsync{r}", max_bytes=None, bulk=True,
                                                                   background=False),
        "overflow_check": lambda r: OverflowCheck(),
        "overflow_check(sync=False)": lambda r: OverflowCheck(sync=False),
        "op_timer": lambda r: OpTimer(),
        "autocompare(all ops)": lambda r: AutoCompare(),
        # the same with a fixed atol: what the magnitude-tied default tolerance costs
        "autocompare(all ops, fixed atol)": lambda r: AutoCompare(atol=1e-5),
    }


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


def _load() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def measure(names: list[str], rounds: int, steps: int, cfg: HFLlamaSize = CFG) -> dict[str, list[tuple[float, float]]]:
    """times[name][round] = the mean step time of that tool in that round (wall, process CPU; in
    seconds), its entry and exit included."""
    tmp = tempfile.mkdtemp(prefix="precision-bench-")
    try:
        make = tools(tmp)
        model = make_hf_llama(cfg)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        data = hf_batches(cfg, steps)
        hf_train_step(model, opt, data[0])  # warm-up, outside any tool
        times: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
        for r in range(rounds):
            order = names[r % len(names):] + names[: r % len(names)]
            for name in order:
                tool = make[name](r) or _Nothing()
                # Entry and exit are timed too: work a tool defers to its exit is part of its cost.
                t0, c0 = time.perf_counter(), time.process_time()
                with tool:
                    for ids in data:
                        hf_train_step(model, opt, ids)
                times[name].append(((time.perf_counter() - t0) / steps, (time.process_time() - c0) / steps))
                # Captures are removed once timed: gigabytes of them left behind would load the
                # disk (write-back) under whichever tool runs next.
                for entry in os.listdir(tmp):
                    shutil.rmtree(os.path.join(tmp, entry), ignore_errors=True)
        return times
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# peak memory: the process's own high-water mark (VmHWM); ru_maxrss would start at the parent's size
_COMPARE = """
import sys, time, torch
torch.set_num_threads(1)
from ditorch_precision import compare_dumps
if len(sys.argv) > 2:
    t0, c0 = time.perf_counter(), time.process_time()
    report = compare_dumps(sys.argv[1], sys.argv[2], on_row=lambda kind, row: None)  # streamed, as the CLI does
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    assert report.passed, "an honest pair must pass"
    print(report.to_dict()["n_ops"], wall, cpu, end=" ")
else:
    print(0, 0, 0, end=" ")
print(next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:")))
"""


def _compare_process(*dirs: str) -> tuple[int, float, float, int]:
    out = subprocess.run([sys.executable, "-c", _COMPARE, *dirs], check=True, capture_output=True, text=True)
    rows, wall, cpu, rss = out.stdout.split()
    return int(rows), float(wall), float(cpu), int(rss) * 1024


def measure_compare(cfg: HFLlamaSize, rounds: int, steps: int) -> dict:
    """Per capture kind: op pairs, median compare wall and CPU seconds, pairs per CPU second, peak RSS."""
    tmp = tempfile.mkdtemp(prefix="precision-bench-")
    try:
        out: dict = {"import_only_rss_mb": _compare_process()[3] / 2**20}
        for kind, bulk in (("per-op files", False), ("bulk", True)):
            for run in "ab":
                model = make_hf_llama(cfg)
                opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
                with Capture(f"{tmp}/{kind}-{run}", max_bytes=None, bulk=bulk):
                    for ids in hf_batches(cfg, steps):
                        hf_train_step(model, opt, ids)
            runs = [_compare_process(f"{tmp}/{kind}-a", f"{tmp}/{kind}-b") for _ in range(rounds)]
            wall, cpu = statistics.median(r[1] for r in runs), statistics.median(r[2] for r in runs)
            out[kind] = {"pairs": runs[0][0], "wall_s": wall, "cpu_s": cpu, "pairs_per_cpu_s": runs[0][0] / cpu,
                         "peak_rss_mb": max(r[3] for r in runs) / 2**20,
                         "capture_mb": sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in
                                           os.walk(f"{tmp}/{kind}-a") for f in fs) / 2**20}
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def summarise(times: dict[str, list[tuple[float, float]]]) -> dict:
    plain = times["plain"]
    out = {}
    for name, per_round in times.items():
        ratios = [t[0] / p[0] for t, p in zip(per_round, plain)]
        cpu_ratios = [t[1] / p[1] for t, p in zip(per_round, plain)]
        out[name] = {"step_ms": statistics.median(t[0] for t in per_round) * 1e3, "ratio": statistics.median(ratios),
                     "ratio_min": min(ratios), "ratio_max": max(ratios),
                     "cpu_ms": statistics.median(t[1] for t in per_round) * 1e3,
                     "cpu_ratio": statistics.median(cpu_ratios)}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=2, help="steps per tool per round")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    p.add_argument("--only", action="append", metavar="TOOL", help="measure only these tools (and plain)")
    p.add_argument("--model", choices=sorted(MODELS), default="bench")
    p.add_argument("--compare", action="store_true", help="time compare_dumps instead of the tools")
    p.add_argument("--json", metavar="FILE")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.compare:
        load_before = _load()
        result = measure_compare(MODELS[a.model], a.rounds, a.steps)
        print(f"{'capture':<14} {'pairs':>6} {'wall s':>7} {'cpu s':>6} {'pairs/cpu s':>11} {'peak MB':>8} "
              f"{'capture MB':>10}")
        for kind in ("per-op files", "bulk"):
            r = result[kind]
            print(f"{kind:<14} {r['pairs']:6d} {r['wall_s']:7.1f} {r['cpu_s']:6.1f} {r['pairs_per_cpu_s']:11.0f} "
                  f"{r['peak_rss_mb']:8.0f} {r['capture_mb']:10.1f}")
        print(f"a process that only imports: {result['import_only_rss_mb']:.0f} MB; load average {load_before} -> "
              f"{_load()}; {a.rounds} rounds, {a.steps} steps, model {a.model}")
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"model": a.model, "config": vars(MODELS[a.model]), "steps": a.steps, "rounds": a.rounds,
                           "load_average": [load_before, _load()], **result}, f, indent=1)
        return 0
    names = list(tools(""))
    if a.only:
        unknown = set(a.only) - set(names)
        if unknown:
            p.error(f"unknown tool(s) {sorted(unknown)}; expected some of {names}")
        names = ["plain"] + [n for n in names if n in a.only and n != "plain"]
    load_before = _load()
    cfg = MODELS[a.model]
    if a.model == "small":  # one module of the small model is the same path
        names = [n for n in names if MLP not in n]
    rows = summarise(measure(names, a.rounds, a.steps, cfg))
    load_after = _load()
    print(f"{'tool':<34} {'step ms':>9} {'ratio':>7} {'range':>13} {'cpu ms':>8} {'cpu ratio':>9} {'target':>7}")
    for name, row in rows.items():
        target = f"{TARGETS[name]:.1f}x" if name in TARGETS else ""
        print(f"{name:<34} {row['step_ms']:9.1f} {row['ratio']:6.2f}x "
              f"{row['ratio_min']:5.2f}-{row['ratio_max']:<5.2f}x "
              f"{row['cpu_ms']:8.1f} {row['cpu_ratio']:8.2f}x {target:>7}")
    print(f"load average {load_before} -> {load_after}; {a.rounds} rounds x {a.steps} steps, "
          f"{torch.get_num_threads()} thread(s)")
    result = {"machine": f"{platform.machine()} {platform.processor() or ''}".strip(), "torch": torch.__version__,
              "threads": torch.get_num_threads(), "config": vars(cfg), "model": "transformers LlamaForCausalLM",
              "rounds": a.rounds, "steps": a.steps,
              "load_average": [load_before, load_after], "tools": rows, "targets": TARGETS}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
