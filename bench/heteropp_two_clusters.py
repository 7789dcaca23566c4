"""Measured, not only simulated: a two-stage plan across two emulated clusters (bench/heteropp_netns.py: a
network namespace per chip type, a tc-shaped link between them) under 1F1B and under H-1F1B, against
the simulator's prediction from the same run's measured stage times and the link's rate.

    python -m bench.heteropp_two_clusters [--rate 50mbit] [--steps 6] [--json FILE]
    python -m bench.heteropp_two_clusters --plans [--rate 50mbit] [--steps 6] [--json FILE]

`--plans`: HeteroAuto plans the same two clusters (two CPU chip types, 2 chips each, B rated slower; chips
may stay idle) twice, with the link
priced (the cluster spec's `links` entry at --rate) and ignored (no entry: the types share the fabric),
and each plan runs across the emulated link under 1F1B and H-1F1B (the warm-up derived from the priced
costs); reported: the plan, its simulated time under each schedule, the measured step time, and the median
|simulated - measured| / measured over them. `--profile measured` (the default): both chip types get the
profile measured on this host first (bench.heteropp_vs_sim.stage_alone_profile: TP 1 alone, TP 2 as a
real pair, the processes' point-to-point, TP all-reduce and ZeRO-1 step times; the emulated hosts share
this host's cores, so A and B are one chip here), and the prediction is the schedule under processor
sharing of the host's cores with their slowdown measured right before and after each plan's run, averaged
(heteropp.auto.shared_cores), a boundary between
the two types taking an activation's wire bytes over --rate for each pipeline sharing the link (the link is
shared fairly: bench.heteropp_link_probe); `--profile analytic`: the chip specs' analytic profile and
the plain simulator, as the planner sees them.

1F1B runs first with per-action timing (HETEROPP_TIMING); its median forward and backward per stage and
the link's transfer time (activation bytes / rate) give H-1F1B's extra warm-up (HARP's rule) and both
predictions; then both schedules run again, alternating, and the median step time (first step excluded)
is reported next to the prediction. Needs root, `ip` and `tc` (exits with the reason otherwise).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

from bench.heteropp_netns import Unavailable, end_addresses, rate_bytes_s, run_across, two_clusters, wire_bytes
from heteropp.auto.simulator import StageTimes, simulate
from heteropp.engine import RunConfig
from heteropp.plan import Plan, StagePlan
from heteropp.schedules import build, h1f1b_extra
from heteropp.spec import ModelSpec

MODEL = ModelSpec("bench-2c", layers=4, hidden=256, heads=8, kv_heads=4, ffn=512, vocab=512, seq_len=256)


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


def measured_profile(repeats: int) -> tuple[Any, dict]:
    """This host's profile of MODEL for both chip types (one chip here) and the processes' communication
    times (bench.heteropp_vs_sim)."""
    from bench.heteropp_vs_sim import stage_alone_profile
    from heteropp.auto.profiles import ChipProfile
    alone, comm = stage_alone_profile(MODEL, repeats)
    cpu = alone.chips["cpu"]
    return dataclasses.replace(alone, chips={"A": cpu, "B": ChipProfile(dict(cpu.tp))}), comm


def shared_prediction(cl: Any, train: Any, prof: Any, comm: dict, slowdown: list[float], plan: Plan,
                      schedule: str, params: dict, rate: float) -> float:
    """The plan's step under processor sharing of this host's cores (measured slowdown), its compute and
    the processes' communication measured (with_comm), a boundary between A and B one activation over the
    link's `rate` (bytes/s, its TCP framing counted: wire_bytes) shared by the dp pipelines, one inside a type
    the processes' measured send."""
    import os

    from bench.heteropp_vs_sim import MeasuredCosts, with_comm
    from heteropp.auto.costs import micro_batches
    from heteropp.auto.plan_sim import plan_stages
    from heteropp.auto.profiles import ChipProfile
    from heteropp.auto.shared_cores import simulate_shared_cores
    from heteropp.auto.simulator import built_schedule

    folded = with_comm(dataclasses.replace(prof, chips={"cpu": prof.chips["A"]}), comm, plan.dp)
    both = dataclasses.replace(folded, chips={"A": folded.chips["cpu"], "B": ChipProfile(dict(folded.chips["cpu"].tp))})
    act = wire_bytes(MODEL.seq_len * MODEL.hidden * 4 * plan.micro_batch_size)

    class LinkCosts(MeasuredCosts):
        def _boundary(self, x: str, tx: int, y: str, ty: int, dp: int) -> float:
            return self.p2p_s if x == y else max(self.p2p_s, dp * act / rate)

    cm = LinkCosts(cl, MODEL, dataclasses.replace(train, schedule=schedule), both, p2p_s=comm["p2p_s"])
    st, es = cm.stage_times(plan_stages(plan), plan.dp)
    b = micro_batches(cm.train, plan.dp)
    sched = built_schedule(schedule, len(plan.stages), b, params) if params else schedule
    ranks = [plan.stage_ranks(k) for k in range(len(plan.stages))]
    return simulate_shared_cores(st, es, b, sched, ranks, float(os.cpu_count() or 1), slowdown,
                                 [s.tp for s in plan.stages])


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
    measured = a.profile == "measured"
    if measured:
        from bench.heteropp_vs_sim import measure_slowdown
        prof, comm = measured_profile(a.repeats)
        print(f"measured profile: tp1 fwd {prof.chips['A'].tp[1].fwd_s:.4f} s, bwd {prof.chips['A'].tp[1].bwd_s:.4f} s "
              "per layer", flush=True)
    priced_cm = CostModel(priced_cl, MODEL, train, prof if measured else analytic_profile(priced_cl, MODEL, train))
    out: dict[str, Any] = {"profile": a.profile}
    errors = []
    for label, priced in (("priced", True), ("ignored", False)):
        cl = cluster_from_dict(cluster_spec(rate_bytes_s(a.rate) / 1e9, priced), label)
        cm = CostModel(cl, MODEL, train, prof if measured else analytic_profile(cl, MODEL, train))
        pb = Problem(cl, MODEL, train, cm)
        plan = planned(pb, Budget(idle="always")).plan  # B may stay idle
        stages = plan_stages(plan)
        params = schedule_params(priced_cm, stages, plan.dp, "h1f1b")
        if not measured:
            sim = {s: simulate_stages(priced_cm, stages, plan.dp, s,
                                      params=params if s == "h1f1b" else None).iteration_time_s
                   for s in ("1f1b", "h1f1b")}
        else:  # the host's slowdown right before and right after the run: the load moves over minutes
            before = measure_slowdown(MODEL, plan.world_size)
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
        if measured:
            after = measure_slowdown(MODEL, plan.world_size)
            slowdown = [(x + y) / 2 for x, y in zip(before, after)]
            print("slowdown with 1.. ranks computing at once, before / after the run: "
                  + ", ".join(f"{x:.2f}/{y:.2f}" for x, y in zip(before, after)), flush=True)
            sim = {s: shared_prediction(priced_cl, train, prof, comm, slowdown, plan, s,
                                        params if s == "h1f1b" else {}, rate_bytes_s(a.rate))
                   for s in ("1f1b", "h1f1b")}
        out[label] = {
            "plan": [asdict(s) for s in plan.stages],
            "dp": plan.dp,
            "simulated_s": sim,
            **({"slowdown_before_after": [before, after]} if measured else {}),
            "measured_s": {n: statistics.median(tokens / x["tokens_per_s"] for x in v[1:]) for n, v in steps.items()},
        }
        desc = " | ".join(f"{s.chip} tp{s.tp} x{s.layers}" for s in plan.stages)
        meas = out[label]["measured_s"]
        out[label]["error"] = {n: sim[n] / meas[n] - 1 for n in sim}
        errors += [abs(e) for e in out[label]["error"].values()]
        print(f"links {label:>7}: {desc}, dp {plan.dp}; " + ", ".join(
            f"{n} simulated {sim[n]:.3f} s measured {meas[n]:.3f} s ({100 * out[label]['error'][n]:+.1f}%)"
            for n in sim), flush=True)
    out["median_abs_error"] = statistics.median(errors)
    print(f"median |simulated - measured| / measured over the plans and schedules: "
          f"{100 * out['median_abs_error']:.1f}% ({a.profile} profile)", flush=True)
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
    ap.add_argument("--profile", choices=("measured", "analytic"), default="measured",
                    help="--plans: the profile measured on this host first (default), or the analytic one")
    ap.add_argument("--repeats", type=int, default=7, help="--plans --profile measured: profiler repeats")
    a = ap.parse_args(argv)
    try:
        end_addresses(a.subnet)
    except ValueError as e:
        ap.error(f"--subnet: {e}")
    try:
        rate_bytes_s(a.rate)
    except ValueError as e:
        ap.error(f"--rate: {e}")
    if a.plans:
        load = list(os.getloadavg())
        try:
            with two_clusters(rate=a.rate, subnet=a.subnet) as clusters, tempfile.TemporaryDirectory() as tmp:
                out = compare_plans(a, clusters, Path(tmp))
        except Unavailable as e:
            print(f"skipped: {e}")
            return 0
        if a.json:
            Path(a.json).write_text(json.dumps({"rate": a.rate, "plans": out, "load_before": load,
                                                "load_after": list(os.getloadavg())}, indent=2) + "\n")
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
