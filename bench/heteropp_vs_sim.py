"""Measured HeteroPP iteration time of several plans against HeteroAuto's simulator on a profile taken here.

All ranks are processes on this host and share its cores. A profile taken by one process alone gives the
speed of a chip that has a core to itself, which the ranks of a plan do not have once it uses more
processes than there are cores. So, right before each plan runs, the profile is measured by as many
concurrent profiler processes as the plan has ranks (each with one thread, like the ranks), and the
median of their numbers is the chip's profile under that contention ("contended"). The profile of one
process alone is reported too ("alone"), uncalibrated. The optimizer step per layer, which the profiler
leaves at zero, is timed in the same processes. Boundaries are costed at 1 GB/s (gloo between local
processes, 64 KiB activations: latency-bound).

    python -m bench.heteropp_vs_sim [--steps 8] [--plans NAME,...] [--json FILE]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing as mp
import os
import statistics
import tempfile
import time
from typing import Any

from heteropp.auto.costs import CostModel
from heteropp.auto.plan_sim import simulate_plan
from heteropp.auto.profiles import ChipProfile, Profile
from heteropp.plan import Plan, StagePlan
from heteropp.spec import ModelSpec, TrainSpec
from heteropp.spec.cluster import Cluster, ChipType

from .heteropp_bench_common import MODEL, SMOKE_MODEL, command, machine, table, write_json

LINK_GB_S = 1.0


def _plan(stages: list[tuple[int, int, bool]], dp: int, schedule: str, micro_batches: int, layers: int) -> Plan:
    """stages: (tp, layers, recompute), all on the one chip type `cpu`."""
    return Plan([StagePlan("cpu", tp, n, rc) for tp, n, rc in stages], dp=dp, micro_batch_size=1,
                micro_batches=micro_batches, schedule=schedule, num_layers=layers)


def plans(layers: int, micro_batches: int) -> dict[str, Plan]:
    h, q = layers // 2, layers // 4
    return {
        "uneven 1f1b": _plan([(1, h + q, False), (1, h - q, False)], 1, "1f1b", micro_batches, layers),
        "tp2->1 rc gpipe": _plan([(2, h, True), (1, h, False)], 1, "gpipe", micro_batches, layers),
        "3 stages zbh1": _plan([(1, h - q, False), (1, q + 1, False), (1, layers - h - 1, False)], 1, "zbh1",
                               micro_batches, layers),
        "dp2 1f1b": _plan([(1, h, False), (1, h, False)], 2, "1f1b", micro_batches // 2, layers),
    }


# -- profile ---------------------------------------------------------------------------------------------
def _optim_s(numel: int, repeats: int) -> float:
    """One ZeroAdamW step (dp 1) over `numel` parameters."""
    import torch

    from heteropp.engine.optim import ZeroAdamW
    p = torch.nn.Parameter(torch.zeros(numel))
    p.grad = torch.ones(numel)
    opt = ZeroAdamW([p], 1e-3)
    ts = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        opt.step()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts[1:])


def _profile_proc(model_file: str, tps: list[int], repeats: int, out: mp.Queue) -> None:
    import torch

    from heteropp.auto.profiler import profile_model
    torch.set_num_threads(1)  # as each rank does
    prof = profile_model(model_file, tps, repeats=repeats)
    opt = {t: _optim_s(prof.layer_params // t, repeats) for t in tps}
    out.put((prof.to_dict(), opt))


def measure_profile(m: ModelSpec, tps: list[int], procs: int, repeats: int) -> Profile:
    """The profile under `procs` concurrent profiler processes: the median of their entries."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(dataclasses.asdict(m), f)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    ps = [ctx.Process(target=_profile_proc, args=(f.name, tps, repeats, q)) for _ in range(procs)]
    for p in ps:
        p.start()
    got = [q.get(timeout=300) for _ in ps]
    for p in ps:
        p.join()
    os.unlink(f.name)
    profs = [Profile.from_dict(d) for d, _ in got]
    entries = {}
    for t in tps:
        fields = {k: statistics.median(getattr(p.chips["cpu"].tp[t], k) for p in profs)
                  for k in profs[0].chips["cpu"].tp[t].__dataclass_fields__}
        fields["optim_s"] = statistics.median(o[t] for _, o in got)
        entries[t] = dataclasses.replace(profs[0].chips["cpu"].tp[t], **fields)
    return dataclasses.replace(profs[0], chips={"cpu": ChipProfile(entries)}, meta={**profs[0].meta, "procs": procs})


def predict(m: ModelSpec, plan: Plan, prof: Profile) -> float:
    chip = ChipType("cpu", count=64, memory_gb=64, peak_tflops=0.1, chips_per_node=64, tp_max=4,
                    intra_node_bw=LINK_GB_S, network_bw=LINK_GB_S)
    train = TrainSpec(global_batch=plan.global_batch, micro_batch_size=plan.micro_batch_size, dtype="fp32",
                      zero1=True, schedule=plan.schedule)
    return simulate_plan(CostModel(Cluster("local", (chip,)), m, train, prof), plan).iteration_time_s


# -- measurement ------------------------------------------------------------------------------------------
def measure(m: ModelSpec, plan: Plan, steps: int, skip: int) -> list[float]:
    """Iteration times of steps after the first `skip` (as the last stage's lead rank sees them)."""
    from heteropp.engine import RunConfig, launch
    cfg = RunConfig(plan=plan.to_dict(), model=RunConfig.model_dict(m), steps=steps, backend="gloo",
                    chip_map={"cpu": "cpu"}, timeout_s=120)
    res = launch(cfg)
    lead = next(r[plan.schedule] for r in res.values()
                if r[plan.schedule]["losses"] is not None and r[plan.schedule]["coord"][1:] == (0, 0))
    tokens = plan.global_batch * m.seq_len
    return [tokens / r for r in lead["tokens_per_s"][skip:]]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.heteropp_vs_sim", description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--skip", type=int, default=2, help="leading steps left out (warm-up)")
    ap.add_argument("--micro-batches", type=int, default=8, help="per iteration, over all replicas")
    ap.add_argument("--repeats", type=int, default=5, help="profiler repeats per measurement")
    ap.add_argument("--plans", help="comma-separated plan names (default: all)")
    ap.add_argument("--smoke", action="store_true", help="a seconds-long run on a toy model (tests)")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    m = SMOKE_MODEL if a.smoke else MODEL
    all_plans = plans(m.layers, a.micro_batches)
    names = a.plans.split(",") if a.plans else list(all_plans)
    before = machine()
    alone = measure_profile(m, [1, 2], 1, a.repeats)
    rows, records = [], []
    for name in names:
        plan = all_plans[name]
        prof = measure_profile(m, [1, 2], plan.world_size, a.repeats)
        times = measure(m, plan, a.steps, a.skip)
        meas = statistics.median(times)
        sim, sim_alone = predict(m, plan, prof), predict(m, plan, alone)
        err = (sim - meas) / meas
        rows.append([name, plan.world_size, meas * 1e3, sim * 1e3, f"{100 * err:+.1f}%",
                     sim_alone * 1e3, f"{100 * (sim_alone - meas) / meas:+.1f}%"])
        records.append({"plan": name, "plan_json": plan.to_dict(), "procs": plan.world_size, "measured_s": times,
                        "measured_median_s": meas, "simulated_s": sim, "error": err, "simulated_alone_s": sim_alone,
                        "profile": prof.to_dict()})
    med = statistics.median(abs(r["error"]) for r in records)
    print(table(["plan", "procs", "measured ms", "simulated ms (contended profile)", "error",
                 "simulated ms (profile alone)", "error alone"], rows))
    print(f"median |error| (contended profile): {100 * med:.1f}%")
    after = machine()
    print(f"nproc {before['nproc']}, {before['cpu']}, load {before['loadavg']} -> {after['loadavg']}")
    write_json(a.json, {"machine_before": before, "machine_after": after,
                        "command": command("bench.heteropp_vs_sim", argv), "model": dataclasses.asdict(m),
                        "link_gb_s": LINK_GB_S, "median_abs_error": med, "plans": records,
                        "profile_alone": alone.to_dict()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
