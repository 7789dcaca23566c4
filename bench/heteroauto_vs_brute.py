"""The planner's plan against the brute force over (plan, schedule parameters), each simulated
(heteropp/auto/brute_force.py), on small random instances of three chip types: 1 or 2 chips each, 4 to 7
layers, 4 to 8 micro-batches, links of 0.02 to 2 GB/s. Prints, per schedule, the worst gap (how much
slower the planner's plan simulates than the brute force's), where it is and how many instances have one.

    python -m bench.heteroauto_vs_brute [--instances 30] [--seed 0] [--schedules h1f1b zbh1 ...] [--json FILE]
        [--family default|tight|tight-small] [--extended]

`--extended`: against the brute force over the larger space (idle chips anywhere, any dp, types
interleaved; brute_force(extended=True)) instead of the contiguous one.
"""
from __future__ import annotations

import argparse
import json
import random
import time
from dataclasses import replace
from pathlib import Path

from heteropp.auto.brute_force import brute_force
from heteropp.auto.costs import CostModel
from heteropp.auto.front_door import plan as planned
from heteropp.auto.planning import Problem
from heteropp.auto.profiles import ChipProfile, Profile, TPProfile
from heteropp.schedules import kind
from heteropp.spec import InfeasibleError, ModelSpec, TrainSpec, cluster_from_dict

SCHEDULES = ("1f1b", "h1f1b", "interleaved")  # measured by default
MORE_SCHEDULES = ("gpipe", "zbh1")  # on request (--schedules)
TYPES = ("X", "Y", "Z")


# (chips per type, memory in GB, link bandwidths in GB/s, layers) of the default instances and of the
# tight ones (--family tight: slow links and tight memory, where idle chips, any dp and interleaved types win)
FAMILIES = {"default": ((1, 2), (8.0, 12.0, 20.0), (0.02, 0.05, 0.2, 2.0), (4, 7)),
            "tight": ((1, 3), (4.0, 6.0, 8.0), (0.005, 0.02), (4, 7)),
            "tight-small": ((1, 2), (4.0, 6.0, 8.0), (0.005, 0.02), (4, 5))}


def random_problem(rng: random.Random, schedule: str, family: str = "default") -> Problem:
    """Three one-chip-per-node types (default: 1 or 2 chips, 8 to 20 GB; FAMILIES) with hand-set per-layer
    times (X 1.0, the others 0.5 to 1.5 of it; one layer's weights, gradients and optimizer state 1.6 GB,
    activations 1 GB per micro-batch), every pair joined by its own link."""
    counts, mems, bandwidths, layer_range = FAMILIES[family]
    chips = [{"name": n, "count": rng.randint(*counts), "memory_gb": rng.choice(mems),
              "peak_tflops": 100, "chips_per_node": 1, "tp_max": 1, "intra_node_bw": 100, "network_bw": 10.0,
              "memory_fraction": 1.0} for n in TYPES]
    speed = {"X": 1.0, "Y": rng.choice([0.5, 0.8, 1.2]), "Z": rng.choice([0.5, 0.8, 1.5])}
    links = [{"between": [a, c], "bandwidth": rng.choice(bandwidths)}
             for a, c in (("X", "Y"), ("X", "Z"), ("Y", "Z"))]
    layers, gb = rng.randint(*layer_range), rng.choice([4, 6, 8])
    cluster = cluster_from_dict({"name": "small", "chips": chips, "links": links}, "bench")
    model = ModelSpec("m", layers=layers, hidden=1024, heads=8, kv_heads=8, ffn=4096, vocab=1000, seq_len=128)
    train = TrainSpec(global_batch=gb, micro_batch_size=1, dtype="bf16", zero1=True, schedule=schedule)
    timing = {n: TPProfile(fwd_s=f, bwd_s=2 * f, recompute_s=f, wgrad_s=f, act_bytes=1e9, ckpt_bytes=1e8,
                           optim_s=0.01, head_s=f) for n, f in speed.items()}
    profile = Profile(model="m", micro_batch_size=1, seq_len=128, layer_params=100_000_000,
                      embed_params=10_000_000, head_params=10_000_000,
                      chips={n: ChipProfile({1: t}) for n, t in timing.items()})
    searched = replace(train, schedule=kind(schedule).searched_as or schedule)
    return Problem(cluster, model, train, CostModel(cluster, model, searched, profile))


def measure(instances: int, seed: int, schedules: tuple[str, ...] = SCHEDULES, family: str = "default",
            extended: bool = False) -> dict:
    """Per schedule: the instances both sides can run, the worst gap and its instance, the least gap over
    the planner's plans that use every chip, as the brute force's do (below 0 only where the plan does not
    fit), how many plans leave chips idle and run faster than the brute force's best (the baselines' types
    alone or rounded counts), how many have a gap over 0.1%, and the planner's longest planning time.
    Instance i is the same under every schedule."""
    out = {}
    for sched in schedules:
        rng = random.Random(seed)
        gaps, slowest, idle_wins = [], 0.0, 0
        for i in range(instances):
            pb = random_problem(rng, sched, family)
            t0 = time.perf_counter()
            try:
                plan = planned(pb).plan
            except InfeasibleError:
                plan = None
            slowest = max(slowest, time.perf_counter() - t0)
            best = brute_force(pb, extended)[0]
            if plan is not None and best < float("inf"):
                if (not extended and sum(plan.chips_used().values()) < pb.cluster.total_chips
                        and plan.iteration_time_s < best):
                    idle_wins += 1  # outside the brute force's space (every chip in a one-chip stage)
                    continue
                gaps.append((plan.iteration_time_s / best - 1, i))
        worst = max(gaps, default=(0.0, -1))
        out[sched] = {"instances": len(gaps), "worst_gap": worst[0], "worst_instance": worst[1],
                      "least_gap": min(gaps, default=(0.0, -1))[0],
                      "with_gap": sum(g > 1e-3 for g, _ in gaps), "max_planning_s": slowest,
                      "faster_with_idle_chips": idle_wins}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--instances", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--schedules", nargs="+", choices=SCHEDULES + MORE_SCHEDULES, default=list(SCHEDULES))
    ap.add_argument("--json")
    ap.add_argument("--family", choices=sorted(FAMILIES), default="default")
    ap.add_argument("--extended", action="store_true", help="the brute force over the larger space")
    a = ap.parse_args(argv)
    if a.instances < 1:
        ap.error(f"--instances must be at least 1, got {a.instances}")
    res = measure(a.instances, a.seed, tuple(a.schedules), a.family, a.extended)
    print("| schedule | instances | worst gap | at instance | instances over 0.1% | longest planning |")
    print("|---|---|---|---|---|---|")
    for sched, v in res.items():
        print(f"| {sched} | {v['instances']} | {100 * v['worst_gap']:.1f}% | {v['worst_instance']} | "
              f"{v['with_gap']} | {v['max_planning_s']:.2f} s |")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
