"""The cost model's estimate against the simulator, per schedule and micro-batch range, on random plans of
HARP Setting 1 (two clusters joined by a 5 Gbps link): the worst relative error each way. Interleaved
1F1B runs each plan as 2 chunks per stage (plans with a stage of one layer are skipped), its micro-batch
counts rounded down to a multiple of the stages.

    python -m bench.heteroauto_estimate [--plans 60] [--seed 0] [--json FILE]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import random
from pathlib import Path

from heteropp.auto.costs import StageSpec
from heteropp.auto.plan_sim import schedule_params, simulate_stages
from heteropp.auto.planning import load_problem, virtual_stages

EX = Path(__file__).resolve().parents[1] / "examples"
SCHEDULES = ("gpipe", "1f1b", "h1f1b", "zbh1", "interleaved")
CHUNKS = 2
RANGES = {"2-8": (2, 3, 4, 6, 8), "16-64": (16, 32, 64)}


def random_plan(rng: random.Random, layers: int) -> list[StageSpec]:
    """A pipeline of A100 stages then V100e stages (crossing the slow link once), TP filling 32 chips a type."""
    p = rng.choice([2, 3, 4, 6])
    na = rng.randint(1, p - 1)
    seq = ["A100"] * na + ["V100e"] * (p - na)
    tps = {c: min(8, 1 << ((32 // n).bit_length() - 1)) for c, n in (("A100", na), ("V100e", p - na))}
    split = [1] * p
    for _ in range(layers - p):
        split[rng.randrange(p)] += 1
    return [StageSpec(c, tps[c], n, False) for c, n in zip(seq, split)]


def measure(plans: int, seed: int) -> dict:
    pb = load_problem(str(EX / "clusters/harp.yaml"), str(EX / "models/gpt-harp.yaml"),
                      str(EX / "training/harp.yaml"))
    cm, rng = pb.cm, random.Random(seed)
    stages = [random_plan(rng, pb.model.layers) for _ in range(plans)]
    out: dict = {}
    for sched in SCHEDULES:
        for label, bs in RANGES.items():
            lo, hi = 0.0, 0.0
            for st in stages:
                interleaved = sched == "interleaved"
                if interleaved and any(s.layers < CHUNKS for s in st):
                    continue
                for b in bs:
                    b = max(b // len(st), 1) * len(st) if interleaved else b
                    cm.train = dataclasses.replace(cm.train, global_batch=b * cm.train.micro_batch_size,
                                                   schedule=sched)
                    q = {"chunks": CHUNKS} if interleaved else schedule_params(cm, st, 1, sched)
                    est = cm.evaluate(st, 1, b, sched, round_trips=True, params=q).iteration_time_s
                    run = virtual_stages(st, CHUNKS) if interleaved else st
                    sim = simulate_stages(cm, run, 1, sched, params=q).iteration_time_s
                    lo, hi = min(lo, est / sim - 1), max(hi, est / sim - 1)
            out[f"{sched} {label}"] = {"under": lo, "over": hi}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--plans", type=int, default=60)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    res = measure(a.plans, a.seed)
    print("| schedule | micro-batches | worst under | worst over |\n|---|---|---|---|")
    for key, v in res.items():
        sched, label = key.split()
        print(f"| {sched} | {label} | {100 * v['under']:+.1f}% | {100 * v['over']:+.1f}% |")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
