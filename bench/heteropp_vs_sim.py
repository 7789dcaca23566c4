"""Measured HeteroPP iteration time of several plans against HeteroAuto's simulator on a profile taken here.

All ranks are processes on this host and share its cores. Two predictions per plan:
- "shared cores": each TP size's entry timed by exactly that many processes and nothing else (TP 1: one
  process alone; TP 2: a real pair, its all-reduces in the timings, since a TP collective between compute
  costs far more than the same all-reduce looped back to back), communication timed between two
  processes, and the simulator's schedule under processor sharing (heteropp.auto.shared_cores) with the
  host's measured slowdown when k ranks compute at once (k processes doing the same work together against
  one alone: the throughput the host loses to sharing, beyond fair shares of its cores).
- "contended": right before each plan runs, as many profiler processes as the plan has ranks start
  together in one gloo job and time, all at once, the engine's own stage (TP 2 over a real pair of them,
  collectives included), the ZeRO-1 optimizer step with a real dp group and a one-way activation send;
  their medians are the profile, every rank assumed busy at once, fed to the plain simulator.

Profiling and measuring alternate in rounds (each: both profiles, then one launch per plan); the predictions
and the measured times are medians over rounds.

    python -m bench.heteropp_vs_sim [--steps 8] [--rounds 3] [--plans NAME,...] [--json FILE]
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

from heteropp.auto.costs import CostModel, micro_batches
from heteropp.auto.plan_sim import plan_stages, simulate_plan, stage_times
from heteropp.auto.shared_cores import simulate_shared_cores
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
def _median_time(fn, repeats: int) -> float:
    fn()  # warm-up
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def _comm_times(m: ModelSpec, dp: int, repeats: int, mine: Any) -> dict[str, float]:
    """Over this rank's gloo group of two neighbouring ranks (`mine`; None: it has no peer): one TP
    all-reduce of an activation, one one-way send of an activation (half a ping-pong) and one ZeroAdamW
    step over a layer's parameters at `dp` (gradient all-reduce and shard all-gather included). Every rank
    times at once, as in a plan."""
    import torch
    import torch.distributed as dist

    from heteropp.engine.optim import ZeroAdamW
    r = dist.get_rank()
    act = torch.randn(m.seq_len * m.hidden)
    out: dict[str, float | None] = {"tp_allreduce_s": None, "p2p_s": None, "zero_step_s": None}
    if mine is not None:
        peer = r ^ 1
        out["tp_allreduce_s"] = _median_time(lambda: dist.all_reduce(act, group=mine), repeats)

        def ping() -> None:
            if r % 2 == 0:
                dist.send(act, peer), dist.recv(act, peer)
            else:
                dist.recv(act, peer), dist.send(act, peer)
        out["p2p_s"] = _median_time(ping, repeats) / 2
    p = torch.nn.Parameter(torch.zeros(m.layer_params))
    p.grad = torch.ones(m.layer_params)
    group = mine if dp > 1 else None
    opt = ZeroAdamW([p], 1e-3, group, r % 2 if dp > 1 else 0, dp) if (dp == 1 or mine is not None) else None
    if opt is not None:
        out["zero_step_s"] = _median_time(opt.step, repeats)
    dist.barrier()
    return out


def _profile_proc(model_file: str, tps: list[int], repeats: int, dp: int, rank: int, procs: int, store: str,
                  out: mp.Queue) -> None:
    import torch
    import torch.distributed as dist

    from heteropp.auto.profiler import profile_model
    from heteropp.spec import load_model
    torch.set_num_threads(1)  # as each rank does
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=procs)
    from heteropp.model import TPGroup
    pairs = [dist.new_group([i, i + 1]) for i in range(0, procs - 1, 2)]
    mine = pairs[rank // 2] if rank // 2 < len(pairs) else None
    # TP 2 is timed over a real pair of ranks where this rank has a peer, so its all-reduces are included
    tp = TPGroup(rank % 2, 2, mine) if mine is not None else None
    dist.barrier()  # all start busy together, as the ranks of a plan do
    # the typical round, not the least disturbed: the measured side is a median of iterations too
    prof = profile_model(model_file, tps, repeats=repeats, stat="median", tp_group=tp)
    dist.barrier()
    comm = _comm_times(load_model(model_file), dp, 4 * repeats, mine)
    dist.destroy_process_group()
    out.put((prof.to_dict(), comm))


def _get(q: mp.Queue, ps: list, timeout_s: float = 300.0) -> Any:
    """The next profiler result; fails as soon as a profiler process died without one."""
    import queue
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return q.get(timeout=1.0)
        except queue.Empty as empty:
            dead = [p.exitcode for p in ps if p.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"a profiler process exited with code {dead[0]} before reporting") from empty
            if time.monotonic() > deadline:
                raise TimeoutError(f"profiler processes reported nothing within {timeout_s:.0f} s") from empty


def _run_ranks(target, m: ModelSpec, procs: int, *args) -> list:
    """Starts `procs` spawned processes, target(model_file, *args, rank, procs, store, queue), sharing a file of
    `m`'s spec and a file store for their gloo group; returns what they put on the queue, in arrival order."""
    with tempfile.TemporaryDirectory() as tmp:
        model_file, store = os.path.join(tmp, "model.json"), os.path.join(tmp, "store")
        spec = dataclasses.asdict(m)
        head_dim = spec.pop("explicit_head_dim")  # the spec file's name for it is head_dim
        with open(model_file, "w") as f:
            json.dump(spec if head_dim is None else {**spec, "head_dim": head_dim}, f)
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        ps = [ctx.Process(target=target, args=(model_file, *args, r, procs, store, q)) for r in range(procs)]
        for p in ps:
            p.start()
        got = [_get(q, ps) for _ in ps]
        for p in ps:
            p.join()
    return got


def measure_profile(m: ModelSpec, tps: list[int], procs: int, dp: int, repeats: int) -> tuple[Profile, dict]:
    """The compute profile under `procs` concurrent profiler processes (the median of their entries), and
    the communication times measured between those processes."""
    got = _run_ranks(_profile_proc, m, procs, tps, repeats, dp)
    profs = [Profile.from_dict(d) for d, _ in got]
    # medians over the ranks that timed each (a rank without a peer times no pair operation)
    comm = {k: statistics.median([c[k] for _, c in got if c[k] is not None] or [0.0]) for k in got[0][1]}
    entries = {}
    for t in tps:
        fields = {k: statistics.median(getattr(p.chips["cpu"].tp[t], k) for p in profs)
                  for k in profs[0].chips["cpu"].tp[t].__dataclass_fields__}
        entries[t] = dataclasses.replace(profs[0].chips["cpu"].tp[t], **fields)
    meta = {**profs[0].meta, "procs": procs, "tp_collectives": 2 if procs > 1 else None}
    return dataclasses.replace(profs[0], chips={"cpu": ChipProfile(entries)}, meta=meta), comm


def stage_alone_profile(m: ModelSpec, repeats: int) -> tuple[Profile, dict]:
    """TP 1 timed by one process alone and TP 2 by a real pair alone (its all-reduces in the timings), merged
    into one profile; and the communication times measured between the two processes of the pair."""
    one, _ = measure_profile(m, [1], 1, 1, repeats)
    pair, comm = measure_profile(m, [2], 2, 2, repeats)
    meta = {**one.meta, "procs": {"1": 1, "2": 2}, "tp_collectives": 2}
    entries = {1: one.chips["cpu"].tp[1], 2: pair.chips["cpu"].tp[2]}
    return dataclasses.replace(one, chips={"cpu": ChipProfile(entries)}, meta=meta), comm


def _sharing_proc(model_file: str, calls: int, rank: int, procs: int, store: str, out: mp.Queue) -> None:
    import torch
    import torch.distributed as dist

    from heteropp.auto.profiler import _LocalTP, _Net
    from heteropp.spec import load_model
    torch.set_num_threads(1)
    m = load_model(model_file)
    net = _Net(m, _LocalTP(0, 1), 2, False)
    tokens = torch.randint(0, m.vocab, (1, m.seq_len))

    def step() -> None:
        net(tokens).backward()
        net.zero_grad(set_to_none=True)
    step()
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=procs)
    dist.barrier()  # all compute at once from here
    ends = [time.perf_counter()]  # the monotonic clock is one clock for all processes of the host
    for _ in range(calls):
        step()
        ends.append(time.perf_counter())
    out.put(ends)
    dist.barrier()
    dist.destroy_process_group()


def measure_slowdown(m: ModelSpec, most: int, calls: int = 40) -> list[float]:
    """Entry k-1: k processes run the same training steps of a 2-layer stage at once; k times one process's
    step rate alone over their summed step rate while all of them run (from the last one's start to the first
    one's finish: no skew at either end; the host's throughput, whichever core each lands on)."""
    rate = []
    for k in range(1, most + 1):
        got = _run_ranks(_sharing_proc, m, k, calls)
        lo, hi = max(e[0] for e in got), min(e[-1] for e in got)
        done = sum(lo < t <= hi for e in got for t in e[1:])
        if hi <= lo or done < k:
            raise RuntimeError(f"{k} processes never all ran at once; raise the step count ({calls})")
        rate.append(done / (hi - lo))
    return [k * rate[0] / r for k, r in enumerate(rate, 1)]


def with_comm(prof: Profile, comm: dict, dp: int) -> Profile:
    """The profile with the measured communication folded in. Where the profile's TP entry was timed without
    real collectives: per layer two TP all-reduces forward, two backward and two more in a recomputed
    forward; the embedding's and the loss's all-reduces counted as two more. The optimizer entry becomes dp
    times the measured ZeRO-1 step, which the cost model divides by dp again (its own bandwidth-based
    gradient sync is switched off in MeasuredCosts)."""
    entries = {}
    timed = prof.meta.get("tp_collectives")
    for t, e in prof.chips["cpu"].tp.items():
        ar = 2 * comm["tp_allreduce_s"] if t > 1 and t != timed else 0.0
        opt = dp * comm["zero_step_s"] / t if dp > 1 else e.optim_s
        entries[t] = dataclasses.replace(e, fwd_s=e.fwd_s + ar, bwd_s=e.bwd_s + ar, recompute_s=e.recompute_s + ar,
                                         head_s=e.head_s + ar, optim_s=opt)
    return dataclasses.replace(prof, chips={"cpu": ChipProfile(entries)})


class MeasuredCosts(CostModel):
    """The cost model with the boundary transfer and gradient sync taken from measurements on this host."""

    def __init__(self, *a, p2p_s: float, **kw) -> None:
        super().__init__(*a, **kw)
        self.p2p_s = p2p_s

    def _boundary(self, a: str, ta: int, b: str, tb: int, dp: int) -> float:
        return self.p2p_s

    def _grad_sync(self, chip: str, params_per_chip: float, dp: int, tp: int, one_node: bool | None = None,
                   zero1: bool | None = None) -> float:
        return 0.0  # inside the measured ZeRO-1 step (with_comm)


def _cost_model(m: ModelSpec, plan: Plan, prof: Profile, comm: dict | None) -> CostModel:
    chip = ChipType("cpu", count=64, memory_gb=64, peak_tflops=0.1, chips_per_node=64, tp_max=4,
                    intra_node_bw=LINK_GB_S, network_bw=LINK_GB_S)
    train = TrainSpec(global_batch=plan.global_batch, micro_batch_size=plan.micro_batch_size, dtype="fp32",
                      zero1=True, schedule=plan.schedule)
    cl = Cluster("local", (chip,))
    return CostModel(cl, m, train, prof) if comm is None else \
        MeasuredCosts(cl, m, train, with_comm(prof, comm, plan.dp), p2p_s=comm["p2p_s"])


def predict(m: ModelSpec, plan: Plan, prof: Profile, comm: dict | None = None) -> float:
    return simulate_plan(_cost_model(m, plan, prof, comm), plan).iteration_time_s


def predict_shared(m: ModelSpec, plan: Plan, prof: Profile, comm: dict, cores: float,
                   slowdown: list[float] | None = None) -> float:
    """The plan's schedule with its tp x dp ranks per stage sharing `cores` (processor sharing, fair or with
    the measured `slowdown`); `prof`'s TP t entries timed with t ranks running (stage_alone_profile)."""
    cm = _cost_model(m, plan, prof, comm)
    st, es = stage_times(cm, plan_stages(plan), plan.dp)
    ranks = [plan.stage_ranks(k) for k in range(len(plan.stages))]
    return simulate_shared_cores(st, es, micro_batches(cm.train, plan.dp), plan.schedule, ranks, cores, slowdown,
                                 [s.tp for s in plan.stages])


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


def _round(m: ModelSpec, all_plans: dict[str, Plan], names: list[str], a: argparse.Namespace, cores: float,
           most: int) -> dict:
    """One round: the stage-alone profile and the slowdown, then per plan its contended profile and one launch.
    Rounds interleave profiling with measuring, so a host whose speed drifts over minutes moves both alike."""
    alone, pair_comm = stage_alone_profile(m, a.repeats)
    slowdown = measure_slowdown(m, most)
    print("slowdown with 1, 2, ... ranks computing at once: " + ", ".join(f"{x:.2f}" for x in slowdown))
    per_plan = {}
    for name in names:
        plan = all_plans[name]
        prof, comm = measure_profile(m, [1, 2], plan.world_size, plan.dp, a.repeats)
        times = measure(m, plan, a.steps, a.skip)
        per_plan[name] = {"measured_s": times, "simulated_s": predict(m, plan, prof, comm),
                          "simulated_shared_s": predict_shared(m, plan, alone, pair_comm, cores, slowdown),
                          "profile": prof.to_dict(), "comm_s": comm}
    return {"profile_alone": alone.to_dict(), "comm_two_processes_s": pair_comm, "slowdown": slowdown,
            "plans": per_plan}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.heteropp_vs_sim", description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--skip", type=int, default=2, help="leading steps left out (warm-up)")
    ap.add_argument("--micro-batches", type=int, default=8, help="per iteration, over all replicas")
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds of profiling then one launch per plan (medians over rounds)")
    ap.add_argument("--repeats", type=int, default=15, help="profiler repeats per measurement")
    ap.add_argument("--plans", help="comma-separated plan names (default: all)")
    ap.add_argument("--cores", type=float, help="cores the ranks share (default: this host's count)")
    ap.add_argument("--smoke", action="store_true", help="a seconds-long run on a toy model (tests)")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    if a.rounds < 1:
        ap.error(f"--rounds must be at least 1, got {a.rounds}")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    m = SMOKE_MODEL if a.smoke else MODEL
    all_plans = plans(m.layers, a.micro_batches)
    names = a.plans.split(",") if a.plans else list(all_plans)
    if unknown := [n for n in names if n not in all_plans]:
        ap.error(f"unknown plan(s) {unknown}; expected some of {list(all_plans)}")
    before = machine()
    cores = float(a.cores or os.cpu_count() or 1)
    most = max(all_plans[n].world_size for n in names)  # the slowdown only as far as the selected plans need
    # each round starts at another plan, so no plan always runs right after the profiling
    rounds = [_round(m, all_plans, names[i % len(names):] + names[:i % len(names)], a, cores, most)
              for i in range(a.rounds)]
    rows, records = [], []
    for name in names:
        plan, got = all_plans[name], [r["plans"][name] for r in rounds]
        meas = statistics.median(statistics.median(g["measured_s"]) for g in got)
        contended = statistics.median(g["simulated_s"] for g in got)
        shared = statistics.median(g["simulated_shared_s"] for g in got)
        err, err_s = (contended - meas) / meas, (shared - meas) / meas
        rows.append([name, plan.world_size, meas * 1e3, contended * 1e3, f"{100 * err:+.1f}%",
                     shared * 1e3, f"{100 * err_s:+.1f}%"])
        records.append({"plan": name, "plan_json": plan.to_dict(), "procs": plan.world_size,
                        "measured_s": [t for g in got for t in g["measured_s"]], "measured_median_s": meas,
                        "simulated_s": contended, "error": err, "simulated_shared_s": shared, "error_shared": err_s,
                        "rounds": got})
    med = statistics.median(abs(r["error"]) for r in records)
    med_s = statistics.median(abs(r["error_shared"]) for r in records)
    print(table(["plan", "procs", "measured ms", "simulated ms (contended profile)", "error",
                 f"simulated ms ({cores:g} shared cores)", "error shared"], rows))
    print(f"median |error|: contended profile {100 * med:.1f}%, shared cores {100 * med_s:.1f}%")
    after = machine()
    print(f"nproc {before['nproc']}, {before['cpu']}, load {before['loadavg']} -> {after['loadavg']}")
    write_json(a.json, {"machine_before": before, "machine_after": after,
                        "command": command("bench.heteropp_vs_sim", argv), "model": dataclasses.asdict(m),
                        "link_gb_s": LINK_GB_S, "cores": cores, "median_abs_error": med,
                        "median_abs_error_shared": med_s, "plans": records,
                        "rounds": [{k: v for k, v in r.items() if k != "plans"} for r in rounds]})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
