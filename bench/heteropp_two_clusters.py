"""Measured, not only simulated: a two-stage plan across two emulated clusters (bench/heteropp_netns.py: a
network namespace per chip type, a tc-shaped link between them) under 1F1B and under H-1F1B, against
the simulator's prediction from the same run's measured stage times and the link's rate.

    python -m bench.heteropp_two_clusters [--rate 50mbit] [--steps 6] [--json FILE]
    python -m bench.heteropp_two_clusters --plans [--rate 50mbit] [--steps 6] [--json FILE]

`--plans`: HeteroAuto plans the same two clusters (two CPU chip types, 2 chips each, B rated slower; chips
may stay idle) twice, with the link
priced (the cluster spec's `links` entry at --rate) and ignored (no entry: the types share the fabric),
and each plan runs across the emulated link under 1F1B and H-1F1B (the warm-up derived from the priced
costs); reported: the plan, its simulated time under each schedule, the measured step time.

1F1B runs first with per-action timing (HETEROPP_TIMING); its median forward and backward per stage and
the link's transfer time (activation bytes / rate) give H-1F1B's extra warm-up (HARP's rule) and both
predictions; then both schedules run again, alternating, and the median step time (first step excluded)
is reported next to the prediction. Needs root, `ip` and `tc` (exits with the reason otherwise).
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from bench.heteropp_netns import Unavailable, end_addresses, run_across, two_clusters
from heteropp.auto.simulator import StageTimes, simulate
from heteropp.engine import RunConfig
from heteropp.plan import Plan, StagePlan
from heteropp.schedules import build, h1f1b_extra
from heteropp.spec import ModelSpec

MODEL = ModelSpec("bench-2c", layers=4, hidden=256, heads=8, kv_heads=4, ffn=512, vocab=512, seq_len=256)
_RATE = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}


def rate_bytes_s(rate: str) -> float:
    for unit, scale in _RATE.items():
        if rate.endswith(unit):
            return float(rate[: -len(unit)]) * scale / 8
    raise SystemExit(f"--rate: expected e.g. 50mbit or 1gbit, got {rate!r}")


def stage_times(timing_dir: Path) -> list[tuple[float, float]]:
    """Median forward and backward per stage, over every step but the first."""
    out: dict[int, tuple[list[float], list[float]]] = {}
    for f in timing_dir.glob("rank*.jsonl"):
        for line in f.read_text().splitlines()[1:]:
            d = json.loads(line)
            fw, bw = out.setdefault(d["stage"], ([], []))
            for op, _, t0, t1 in d["spans"]:
                (fw if op == "F" else bw if op == "B" else []).append(t1 - t0)
    return [(statistics.median(out[k][0]), statistics.median(out[k][1])) for k in sorted(out)]


def cluster_spec(rate_gbs: float, priced: bool) -> dict:
    """Two CPU chip types of two chips each (one node each), B rated slower; the link between them priced
    or not."""
    chip = {"count": 2, "memory_gb": 4, "peak_tflops": 0.05, "chips_per_node": 2, "tp_max": 2, "intra_node_bw": 5,
            "network_bw": 0.125, "efficiency": 0.5}
    spec = {"name": "two-emulated", "chips": [{"name": "A", **chip}, {"name": "B", **chip, "peak_tflops": 0.03}]}
    if priced:
        spec["links"] = [{"between": ["A", "B"], "bandwidth": rate_gbs}]
    return spec


def compare_plans(a: argparse.Namespace, clusters, tmp: Path) -> dict:
    """HeteroAuto's plans with the link priced and ignored, each run under 1F1B and H-1F1B."""
    from dataclasses import asdict

    from heteropp.auto.analytic import analytic_profile
    from heteropp.auto.costs import CostModel
    from heteropp.auto.plan_sim import plan_stages, schedule_params, simulate_stages
    from heteropp.auto.front_door import Budget
    from heteropp.auto.front_door import plan as planned
    from heteropp.auto.planning import Problem
    from heteropp.spec import TrainSpec, cluster_from_dict
    train = TrainSpec(global_batch=a.micro_batches, micro_batch_size=1, dtype="fp32", schedule="1f1b")
    priced_cl = cluster_from_dict(cluster_spec(rate_bytes_s(a.rate) / 1e9, True), "priced")
    priced_cm = CostModel(priced_cl, MODEL, train, analytic_profile(priced_cl, MODEL, train))
    out = {}
    for label, priced in (("priced", True), ("ignored", False)):
        cl = cluster_from_dict(cluster_spec(rate_bytes_s(a.rate) / 1e9, priced), label)
        cm = CostModel(cl, MODEL, train, analytic_profile(cl, MODEL, train))
        pb = Problem(cl, MODEL, train, cm)
        plan = planned(pb, Budget(idle="always")).plan  # B may stay idle
        stages = plan_stages(plan)
        params = schedule_params(priced_cm, stages, plan.dp, "h1f1b")
        sim = {
            s: simulate_stages(priced_cm, stages, plan.dp, s, params=params if s == "h1f1b" else None).iteration_time_s
            for s in ("1f1b", "h1f1b")
        }
        plan.schedule, plan.schedule_params = "h1f1b", params
        cfg = RunConfig(
            plan=plan.to_dict(),
            model=RunConfig.model_dict(MODEL),
            steps=a.steps,
            schedules=["1f1b", "h1f1b"],
            backend="gloo",
            chip_map={"A": "cpu", "B": "cpu"},
            timeout_s=300,
        )
        tokens = plan.global_batch * MODEL.seq_len
        steps = run_across(tmp, cfg, clusters)
        out[label] = {
            "plan": [asdict(s) for s in plan.stages],
            "dp": plan.dp,
            "simulated_s": sim,
            "measured_s": {n: statistics.median(tokens / x["tokens_per_s"] for x in v[1:]) for n, v in steps.items()},
        }
        desc = " | ".join(f"{s.chip} tp{s.tp} x{s.layers}" for s in plan.stages)
        print(f"links {label:>7}: {desc}, dp {plan.dp}; " + ", ".join(
            f"{n} simulated {sim[n]:.3f} s measured {out[label]['measured_s'][n]:.3f} s" for n in sim), flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", default="50mbit")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--micro-batches", type=int, default=8)
    ap.add_argument("--json")
    ap.add_argument("--subnet", help="the emulated link's IPv4 network, CIDR (default: $HETEROPP_NETNS_SUBNET, "
                    "else a 10.x.y.0/24 from the pid; bench/heteropp_netns.py)")
    ap.add_argument("--plans", action="store_true", help="HeteroAuto's plans with the link priced and ignored")
    a = ap.parse_args(argv)
    try:
        end_addresses(a.subnet)
    except ValueError as e:
        ap.error(f"--subnet: {e}")
    if a.plans:
        try:
            with two_clusters(rate=a.rate, subnet=a.subnet) as clusters, tempfile.TemporaryDirectory() as tmp:
                out = compare_plans(a, clusters, Path(tmp))
        except Unavailable as e:
            print(f"skipped: {e}")
            return 0
        if a.json:
            Path(a.json).write_text(json.dumps({"rate": a.rate, "plans": out}, indent=2) + "\n")
        return 0
    plan = Plan([StagePlan("A", 1, 2), StagePlan("B", 1, 2)], dp=1, micro_batch_size=1,
                micro_batches=a.micro_batches, num_layers=MODEL.layers)
    cfg = lambda p, scheds: RunConfig(plan=p.to_dict(), model=RunConfig.model_dict(MODEL), steps=a.steps,  # noqa: E731
                                      schedules=scheds, backend="gloo", chip_map={"A": "cpu", "B": "cpu"},
                                      timeout_s=300)
    transfer = MODEL.seq_len * MODEL.hidden * 4 / rate_bytes_s(a.rate)
    try:
        with two_clusters(rate=a.rate, subnet=a.subnet) as clusters, tempfile.TemporaryDirectory() as tmp:
            timing = Path(tmp) / "timing"
            timing.mkdir()
            run_across(Path(tmp), cfg(plan, ["1f1b"]), clusters, {"HETEROPP_TIMING": str(timing)})
            fb = stage_times(timing)
            extra = h1f1b_extra([f + b for f, b in fb], [transfer])
            hplan = Plan(plan.stages, dp=1, micro_batch_size=1, micro_batches=a.micro_batches, num_layers=MODEL.layers,
                         schedule="h1f1b", schedule_params={"extra_warmup": extra})
            measured: dict[str, list[float]] = {"1f1b": [], "h1f1b": []}
            tokens = plan.global_batch * MODEL.seq_len
            for _ in range(2):  # alternate so both see the same load
                for name, steps in run_across(Path(tmp), cfg(hplan, ["1f1b", "h1f1b"]), clusters).items():
                    measured[name] += [tokens / s["tokens_per_s"] for s in steps[1:]]
            delayed = clusters[2]
    except Unavailable as e:
        print(f"skipped: {e}")
        return 0
    st = [StageTimes(f, b, 0.0, 0.0) for f, b in fb]
    predicted = {"1f1b": simulate(st, [transfer], a.micro_batches, "1f1b").iteration_time_s,
                 "h1f1b": simulate(st, [transfer], a.micro_batches,
                                   build("h1f1b", 2, a.micro_batches, {"extra_warmup": extra})).iteration_time_s}
    rows = {name: {"measured_s": statistics.median(v), "predicted_s": predicted[name]} for name, v in measured.items()}
    print(f"link {a.rate} (delay emulated: {delayed}), transfer {transfer * 1e3:.1f} ms per activation, stage F/B "
          + ", ".join(f"{f * 1e3:.1f}/{b * 1e3:.1f} ms" for f, b in fb) + f", H-1F1B extra warm-up {extra}")
    for name, r in rows.items():
        print(f"  {name:>6}: measured {r['measured_s']:.3f} s per step (median), simulated {r['predicted_s']:.3f} s")
    if a.json:
        Path(a.json).write_text(json.dumps({"rate": a.rate, "transfer_s": transfer, "stage_fb_s": fb,
                                            "extra_warmup": extra, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
