"""Elastic heterogeneous training on torch's elastic agent: every rendezvous round re-plans for the chips that
are there and resumes from the newest checkpoint.

Each host runs `torchrun --nnodes=MIN:MAX --nproc-per-node=N --max-restarts=R --rdzv-backend=c10d
--rdzv-endpoint=ADDR:PORT -m heteropp.engine.elastic --config run.json --chip TYPE`, TYPE being the chip type
of that host's processes (a chip type of the run's cluster spec). Membership is torch's: when a worker dies its
agent restarts the host's workers, when a host dies (or joins) the other agents notice through the rendezvous
and restart theirs, and each round's workers then:

1. join a control group (gloo, torch's env:// rendezvous) and gather every rank's chip type;
2. rank 0 plans with HeteroAuto for the chips present (the cluster spec's chip types with the counts found; same
   model, same global batch; chips that no stage needs stay idle) and sends the plan to all;
3. ranks are renumbered in the plan's order (a stage's ranks taken from the ranks of its chip type, in rank
   order, so a TP group stays on one host where it can) and join the plan's process group under a prefix
   unique to the round; idle ranks wait for the round to end;
4. training resumes from the newest complete checkpoint (plan-independent: any plan loads it) and saves every
   `save_every` steps.

Rank 0 of each round appends the round's events to `<checkpoint_dir>/elastic.jsonl`: when the round's workers
started, the chips found, the plan, the time the re-plan took, the step resumed from and when the first step
on the new plan ended; a rank that sees a peer die records when it noticed and what it saw.

A straggler is a fault too: when a stage is found slow (heteropp.engine.straggler), rank 0 re-plans once per
round for its chip type slowed by the measured factor, and when the predicted gain over the remaining steps
exceeds the cost of a restart, the round ends (every rank exits with EXIT_REPLAN, its agent restarts it) and
the next round plans with that chip type's speed (`<checkpoint_dir>/chip-speeds.json`).
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import datetime
import json
import os
import re
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..plan import Plan
from ..spec import Cluster, InfeasibleError, ModelSpec, SpecError, cluster_from_dict, train_from_dict
from .checkpoint import complete_checkpoints
from .config import RunConfig
from .elastic_spawn import SPAWNED_ENV
from .device_match import host_device_name, types_by_name
from .node_gather import host_vendor
from .node_ranks import entry_vendors
from .snapshot import RoundHooks, choose, hosts_of, peer_of
from .snapshot_keeper import KEEPER_ENV
from .straggler import StragglerWatch

EVENTS = "elastic.jsonl"
SPEEDS = "chip-speeds.json"  # chip type -> the fraction of the cluster spec's peak it was measured at
EXIT_REPLAN = 75  # a round's workers end with this when a straggler re-plan pays
EXIT_PEER = 76  # a worker that saw a peer go ends with this, having said so in its line (quiet_agent keeps it out)
# A restart's cost beyond what the round measured of its own start: the agent notices the exit (0.2 s monitor)
# and the rendezvous closes 1 s after its last member joined (elastic_launch.RDZV_CONF).
RDZV_S = 1.2
REJUDGE = 1.25  # a straggler judged not worth a re-plan is judged again once it is this much slower still
PERSIST = 5  # steps in a row a straggler must be found on before a re-plan is judged


def record(cfg: RunConfig, event: str, **fields: Any) -> None:
    root = cfg.opts.checkpoint_dir
    if not root:
        return
    Path(root).mkdir(parents=True, exist_ok=True)
    with open(Path(root) / EVENTS, "a") as f:
        f.write(json.dumps({"event": event, "time": round(time.time(), 3), **fields}) + "\n")


def _read_events(cfg: RunConfig) -> list[dict[str, Any]]:
    path = Path(cfg.opts.checkpoint_dir or ".") / EVENTS
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def chip_counts(cluster: Cluster, chips: list[str]) -> dict[str, int]:
    """How many chips of each type are present, in the cluster spec's order (not the order the ranks arrived
    in: a round's record must not depend on which host joined first)."""
    counts = collections.Counter(chips)
    known = [c.name for c in cluster.chips]
    return {name: counts[name] for name in known + sorted(set(counts) - set(known)) if counts[name]}


def live_cluster(cluster: Cluster, chips: list[str]) -> Cluster:
    """The cluster spec's chip types with the counts present (types with none dropped)."""
    counts = collections.Counter(chips)
    unknown = sorted(set(counts) - {c.name for c in cluster.chips})
    if unknown:
        raise SpecError("--chip", unknown[0], "not a chip type of the cluster spec",
                        "one of " + ", ".join(c.name for c in cluster.chips))
    kept = tuple(dataclasses.replace(c, count=counts[c.name]) for c in cluster.chips if counts[c.name])
    names = {c.name for c in kept}
    return dataclasses.replace(cluster, chips=kept,
                               links={k: v for k, v in cluster.links.items() if set(k) <= names},
                               link_latency={k: v for k, v in cluster.link_latency.items() if set(k) <= names})


def slowed(cluster: Cluster, speeds: dict[str, float]) -> Cluster:
    """The cluster with each chip type's peak TFLOPS times its measured speed (1: as the spec says)."""
    return dataclasses.replace(cluster, chips=tuple(
        dataclasses.replace(c, peak_tflops=c.peak_tflops * speeds.get(c.name, 1.0)) for c in cluster.chips))


def read_speeds(cfg: RunConfig) -> dict[str, float]:
    path = Path(cfg.opts.checkpoint_dir or ".") / SPEEDS
    return {str(k): float(v) for k, v in json.loads(path.read_text()).items()} if path.exists() else {}


def describe(plan: Plan) -> list[str]:
    """The plan's stages and dp, every replica group's in turn (its micro-batches too) where it has groups."""
    out = []
    for g in plan.groups:
        out += [f"{s.chip} tp{s.tp} x{s.layers}" + (f" dp{s.inner_dp}" if s.inner_dp > 1 else "") for s in g.stages]
        out.append(f"dp {g.dp}" + (f", {g.micro_batches} micro-batches" if plan.replicas else ""))
    return out


def chip_list(counts: dict[str, int]) -> str:
    """{"big": 2, "small": 2} -> "big x2, small x2" (chip_counts' order)."""
    return ", ".join(f"{c} x{n}" for c, n in counts.items())


def peer_error(e: BaseException) -> str:
    """An error about a lost peer, in short: its first sentence, without the source locations a transport puts in
    ("... failed: [.../pair.cc:537] Read error [127.0.0.1]:16029: Connection reset by peer. This is typically ...")."""
    first = str(e).splitlines()[0] if str(e) else type(e).__name__
    first = re.sub(r"\[[^\]\s]*\.(?:cc|cpp|h):\d+\]\s*", "", first)
    return first.split(". ")[0][:300]


def process_age_s() -> float:
    """Seconds since this process started (imports included), from /proc."""
    with open("/proc/self/stat") as f:
        start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as f:
        up = float(f.read().split()[0])
    return up - start_ticks / os.sysconf("SC_CLK_TCK")


@dataclasses.dataclass
class StragglerReplan:
    """StragglerWatch's policy in an elastic round: judged once a straggler has been found PERSIST steps in a
    row, and again only when the straggler has slowed by another REJUDGE since (the gain only shrinks as the
    steps left do, unless the chip slows further; a throttled chip's windowed factor climbs over a few steps).
    Gain: the measured step time times (1 - the new plan's predicted time / the running plan's, both on the
    cluster with the straggler's chip type slowed by its measured factor), over the steps left. Cost: this
    round's own start as measured (process start to its first step: imports, rendezvous groups, plan, model,
    checkpoint load) plus the rendezvous' settings (RDZV_S), plus the steps trained again: those since the
    newest in-memory snapshot sent whole (the one of the step before: a rank that exits waits for its own
    snapshot to be sent) or, without snapshots, since the newest complete checkpoint."""
    cfg: RunConfig
    cluster: Cluster  # the chips present, at the speeds this round planned with
    speeds: dict[str, float]
    train: dict[str, Any]
    plan: Plan
    start: int  # the step this round resumed from
    born: float  # when this process started (time.time())
    snapshot_every: int = 0  # the round's in-memory snapshots (0: none)
    per_replica: bool = False  # re-plans may give replica groups (replan)
    judged: float = 0.0  # the slowdown last judged
    streak: int = 0  # consecutive steps that found a straggler
    last: int = -1  # the watch's step count when one was last found

    def __call__(self, watch: StragglerWatch, slow: dict[int, float]) -> None:
        self.streak = self.streak + 1 if watch.calls == self.last + 1 else 1
        self.last = watch.calls
        # a slowdown that lasts: a loaded machine slows a round's first steps unevenly (seen: 2.9x for 13 steps)
        if self.streak < PERSIST or max(slow.values()) < self.judged * REJUDGE:
            return
        self.judged = max(slow.values())
        verdict: list[Any] = [None]
        if dist.get_rank() == 0:
            verdict[0] = self.judge(watch, slow, self.start + watch.calls)
            record(self.cfg, "straggler", **verdict[0])
            print(verdict_line(verdict[0], bool(self.plan.replicas)), flush=True)
        dist.broadcast_object_list(verdict, 0)
        if verdict[0]["replan"]:
            if dist.get_rank() == 0:
                path = Path(self.cfg.opts.checkpoint_dir or ".") / SPEEDS
                tmp = path.with_suffix(".tmp")
                tmp.write_text(json.dumps(verdict[0]["speeds"]))
                os.replace(tmp, path)
            dist.barrier()  # the speeds are in place before any agent starts the next round
            raise SystemExit(EXIT_REPLAN)

    def judge(self, watch: StragglerWatch, slow: dict[int, float], step: int) -> dict[str, Any]:
        k = max(slow, key=lambda i: slow[i])  # the watch's slot: a stage of one replica group
        chip, factor = watch.chips[k], slow[k]
        done = complete_checkpoints(self.cfg.opts.checkpoint_dir) if self.cfg.opts.checkpoint_dir else []
        redo = step - (int(done[-1].name.split("-")[1]) if done else 0)
        if self.snapshot_every:  # `step` is not logged yet: the snapshots up to step - 1 are held
            redo = min(redo, step - (step - 1) // self.snapshot_every * self.snapshot_every)
        v = replan_verdict(self.cluster, self.cfg.model_spec, self.train, self.plan, chip, factor, watch.step_s(),
                           self.cfg.steps - step, watch.first_at - self.born, redo, self.per_replica)
        group, stage = watch.where[k]
        return {"stage": stage, "group": group, "chip": chip, "slowdown": round(factor, 3), "step": step, **v,
                "speeds": {**self.speeds, chip: round(self.speeds.get(chip, 1.0) / factor, 4)}}


def verdict_line(v: dict[str, Any], groups: bool) -> str:
    """The console's line for a straggler verdict (StragglerReplan.judge's, as the events file has it); `groups`:
    the running plan has replica groups (the stage is named with its group)."""
    where = f"group {v['group']} stage {v['stage']}" if groups else f"stage {v['stage']}"
    head = (f"heteropp elastic: step {v['step']}: chip {v['chip']} ({where}) {v['slowdown']:.3g}x slower than "
            "predicted, relative to the other stages; re-plan")
    if v["new_plan"] is None:
        return f"{head}: no plan for the chips at these speeds, going on"
    terms = f"gain {v['gain_s']:g} s over {v['steps_left']} steps, cost {v['cost_s']:g} s"
    return f"{head} ({terms}): " + ("this round ends, the next runs it" if v["replan"] else "not worth it, going on")


def vendor_map(cluster: Cluster, chip_map: dict[str, str]) -> dict[str, str]:
    """Chip type -> ditorch vendor: each type's `device` in the cluster spec, the run's chip map overriding."""
    return {**{c.name: c.device for c in cluster.chips}, **chip_map}


def host_chip(cluster: Cluster, chip_map: dict[str, str], vendor: str, device: str | None = None) -> str:
    """The chip type of a host that names none: the one type of the cluster spec whose vendor is `vendor`, the
    one ditorch selects on the host, and, where several are, the one whose `device_name` pattern the host's
    device name `device` fits (device_match.py). SpecError naming the vendor, the device name and the candidates
    where no type or several fit."""
    types = [c.name for c in cluster.chips]
    vendors = entry_vendors([(t,) for t in types], vendor_map(cluster, chip_map))  # imports ditorch: worker only
    fits = [t for t, v in zip(types, vendors) if v == vendor]
    named = types_by_name({c.name: c.device_name for c in cluster.chips if c.device_name}, device, fits)
    if len(fits) == 1 or len(named) == 1:
        return fits[0] if len(fits) == 1 else named[0]
    if len(named) > 1:
        problem = (f"the device name {device!r} of this host fits the device_name of several chip types of its "
                   f"ditorch vendor {vendor!r}: {', '.join(named)}")
    elif fits:
        problem = (f"several chip types run on this host's ditorch vendor {vendor!r}: {', '.join(fits)}, and its "
                   f"device name {device!r} fits none of their device_name patterns")
    else:
        problem = (f"no chip type runs on this host's ditorch vendor {vendor!r}; the cluster spec's: "
                   + ", ".join(f"{t} ({v or 'no vendor'})" for t, v in zip(types, vendors)))
    raise SpecError("heteropp elastic", "--chip", problem,
                    "this host's chip type given with --chip or HETEROPP_CHIP, or device_name patterns in the "
                    "cluster spec that tell its types apart")


def replan_verdict(cluster: Cluster, m: ModelSpec, train: dict[str, Any], plan: Plan, chip: str, factor: float,
                   step_s: float, left: int, setup_s: float, redo: int, per_replica: bool = False) -> dict[str, Any]:
    """Whether re-planning for `chip` slowed by `factor` pays over `left` steps (StragglerReplan's rule)."""
    from ..auto.plan_sim import simulate_plan
    from ..auto.planning import make_problem
    from ..auto.replica_sim import simulate_groups
    slower = slowed(cluster, {chip: 1 / factor})
    cm = make_problem(slower, m, train_from_dict(train, "<training>", m.seq_len)).cm
    # a plan of replica groups is priced as HeteroAuto priced it (best_per_replica): by the groups' simulator
    now = (simulate_groups if plan.replicas else simulate_plan)(cm, plan).iteration_time_s
    try:
        new: Plan | None = replan(slower, m, train, per_replica)
    except (InfeasibleError, SpecError):
        new = None
    gain = step_s * (1 - new.iteration_time_s / now) * left if new is not None and new.iteration_time_s else 0.0
    cost = setup_s + RDZV_S + redo * step_s
    return {"step_s": round(step_s, 4), "predicted_now_s": now,
            "predicted_new_s": new.iteration_time_s if new else None, "new_plan": describe(new) if new else None,
            "steps_left": left, "gain_s": round(gain, 3), "cost_s": round(cost, 3), "round_setup_s": round(setup_s, 3),
            "redo_steps": redo, "replan": gain > cost}


def replan(cluster: Cluster, m: ModelSpec, train: dict[str, Any], per_replica: bool = False) -> Plan:
    """HeteroAuto's plan for the chips present; InfeasibleError names what is missing. `per_replica` (the run
    started from a plan of replica groups): also replica groups (`heteroauto plan --per-replica`), the faster of
    the two by the cost model."""
    from ..auto import plan as heteroauto_plan
    from ..auto.planning import make_problem
    pb = make_problem(cluster, m, train_from_dict(train, "<training>", m.seq_len))
    try:
        best: Plan | None = heteroauto_plan(pb).plan
    except (InfeasibleError, SpecError):
        if not per_replica:
            raise
        best = None
    if per_replica:
        from ..auto.replicas import best_per_replica
        joined = best_per_replica(pb)
        if joined is not None and (best is None or joined.iteration_time_s < best.iteration_time_s):  # type: ignore[operator]
            return joined
    if best is None:
        raise InfeasibleError("neither one stage list nor replica groups fit the chips present")
    return best


def smallest_fit(cluster: Cluster, m: ModelSpec, train: dict[str, Any]) -> str:
    """The smallest cluster that would fit, per chip type of the spec (that type alone, fewest chips by
    bisection over the spec's count), for the error when the chips present hold no plan."""
    def fits(chip: str, n: int) -> bool:
        try:
            replan(live_cluster(cluster, [chip] * n), m, train)
            return True
        except (InfeasibleError, SpecError):
            return False

    options = []
    for c in cluster.chips:
        if not fits(c.name, c.count):
            continue
        lo, hi = 0, c.count  # fits(hi), not fits(lo)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if fits(c.name, mid) else (mid, hi)
        options.append(f"{hi} x {c.name}")
    return " or ".join(options) if options else "none of the spec's chip types alone, even all of them"


def assign(plan: Plan, chips: list[str]) -> list[int]:
    """World ranks in plan-rank order: each stage's ranks (every replica group's in turn) from the not yet
    taken ranks of its chip type."""
    free: dict[str, list[int]] = collections.defaultdict(list)
    for r, c in enumerate(chips):
        free[c].append(r)
    order = []
    for g in plan.groups:
        for k, s in enumerate(g.stages[:g.devices]):
            need = g.stage_ranks(k)
            if len(free[s.chip]) < need:
                raise InfeasibleError(f"the plan needs {need} more {s.chip} chips than are present")
            order += free[s.chip][:need]
            del free[s.chip][:need]
    return order


def run(cfg: RunConfig, cluster: Cluster, train: dict[str, Any], chip: str, snapshot_every: int = 0,
        per_replica: bool = False) -> int:
    world_rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    started = time.time()
    # when the agent started this worker: its stand-in's start (elastic_spawn), else this process's
    born = float(os.environ.get(SPAWNED_ENV) or started - process_age_s())
    # when each phase of the round's start ended (unix seconds): rank 0 records them with its first step
    phases = {"born": round(born, 3), "imported": round(started, 3)}
    warm = os.environ.get("HETEROPP_WARM_START") == "1"  # forked by the host's warm process (elastic_zygote)
    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=cfg.timeout_s)
    dist.init_process_group("gloo", timeout=timeout)  # the control group: torch's env:// rendezvous
    store = dist.distributed_c10d._get_default_store()
    found: list[Any] = [None] * world
    dist.all_gather_object(found, (chip, os.environ.get(KEEPER_ENV)))
    chips = [c for c, _ in found]
    keepers = hosts_of([k for _, k in found])  # the snapshot keepers of the hosts present
    phases["control"] = time.time()
    m = cfg.model_spec
    decided: list[Any] = [None]
    speeds = read_speeds(cfg)  # chip types measured slow by an earlier round
    if world_rank == 0:
        t0 = time.perf_counter()
        try:
            plan = replan(slowed(live_cluster(cluster, chips), speeds), m, train, per_replica)
            decided[0] = {"plan": plan.to_dict(), "round": uuid.uuid4().hex, "plan_s": time.perf_counter() - t0,
                          "round_t": time.time()}
            if snapshot_every and keepers:  # a whole snapshot in memory at least as new as the disk's
                done = complete_checkpoints(cfg.opts.checkpoint_dir) if cfg.opts.checkpoint_dir else []
                decided[0]["snapshot"] = choose(keepers, int(done[-1].name.split("-")[1]) if done else 0)
        except (InfeasibleError, SpecError) as e:
            decided[0] = {"error": f"{e}; the smallest cluster that fits: {smallest_fit(cluster, m, train)}"}
    dist.broadcast_object_list(decided, 0)
    dist.destroy_process_group()
    phases["planned"] = time.time()
    if "error" in decided[0]:
        # no plan fits what is left: the round fails before touching the checkpoint (the agents retry until
        # their restarts are spent or a host joins; `heteropp run --elastic` then reports this error)
        if world_rank == 0:
            record(cfg, "no_plan", chips=chip_counts(cluster, chips), error=decided[0]["error"])
        raise SystemExit(f"heteropp elastic: no plan for the chips present: {decided[0]['error']}")
    plan = Plan.from_dict(decided[0]["plan"])
    order = assign(plan, chips)
    cfg = dataclasses.replace(cfg, plan=plan.to_dict(), chip_map=vendor_map(cluster, cfg.chip_map))
    done = complete_checkpoints(cfg.opts.checkpoint_dir) if cfg.opts.checkpoint_dir else []
    snap = decided[0].get("snapshot")
    cfg.options = {**cfg.options, "resume": bool(done) or snap is not None}
    resume_step = snap["step"] if snap else int(done[-1].name.split("-")[1]) if done else 0
    prefix = f"heteropp/{decided[0]['round']}"
    # World rank 0 holds the round's store (torch's env:// rendezvous), from which idle ranks read the round's
    # end: it stays until they have, else an idle rank's wait fails, its agent restarts it into a round of its
    # own and the agents that finished wait out torch elastic's exit barrier (300 s) for it.
    idle = [r for r in range(world) if r not in order]
    ended = [f"{prefix}/done", *(f"{prefix}/idle_done/{r}" for r in idle if r != world_rank)]
    if world_rank not in order:  # idle in this plan: wait for the round's end (or be restarted by the agent)
        store.wait([f"{prefix}/done"], datetime.timedelta(days=365))
        store.set(f"{prefix}/idle_done/{world_rank}", "1")
        if world_rank == 0:
            _outlive(store, ended, timeout)
        return 0
    rank = order.index(world_rank)
    if rank == 0:
        rounds = sum(1 for e in _read_events(cfg) if e.get("event") == "round") + 1
        root = Path(cfg.opts.checkpoint_dir or ".")
        root.mkdir(parents=True, exist_ok=True)  # torchrun on a host: nothing made it before
        plan.save(root / f"plan-round{rounds}.json")
        present, stages, source = chip_counts(cluster, chips), describe(plan), "memory" if snap else "disk" if done \
            else "start"
        record(cfg, "round", round=rounds, started=round(started, 3), chips=present, world=world, plan=stages,
               ranks=plan.world_size, plan_s=round(decided[0]["plan_s"], 4), resume_from=resume_step,
               resume_source=source, warm_start=warm, **({"speeds": speeds} if speeds else {}))
        # the user's one line on a new round (the events file has the rest): what it runs on and where it resumes
        print(f"heteropp elastic: round {rounds} on {chip_list(present)}: {'; '.join(stages)}; step "
              f"{resume_step + 1} on, from {'the start' if source == 'start' else source}", flush=True)
    if cfg.backend == "dicomm":
        import dicomm  # noqa: F401  registers the backend
    dist.init_process_group(cfg.backend, store=dist.PrefixStore(prefix, store), rank=rank,
                            world_size=plan.world_size, timeout=timeout)
    phases["pg"] = time.time()
    from .worker import _is_peer_failure, run_rank
    mine = os.environ.get(KEEPER_ENV)
    RoundHooks.current = RoundHooks(
        decided[0]["round"], decided[0]["round_t"], rank, plan.world_size,
        [k for k in (mine, peer_of(mine, keepers) if mine else None) if k], snapshot_every, snap, phases,
        lambda ph, source, step, fallback: record(cfg, "resumed", source=source, step=step,
                                                  **({"memory_refused": fallback} if fallback else {}),
                                                  **{k: round(v, 3) for k, v in ph.items()}))
    StragglerWatch.policy = StragglerReplan(cfg, slowed(live_cluster(cluster, chips), speeds), speeds, train, plan,
                                            resume_step, born, snapshot_every, per_replica)
    try:
        run_rank(cfg, plan, rank)
    except Exception as e:
        if _is_peer_failure(e):
            record(cfg, "peer_failure", rank=world_rank, error=str(e).splitlines()[0][:300])
            # the round is over: exit now, so the agent sees it at its next look (an orderly exit tears down
            # the process groups, a snapshot being sent and torch, seen to take 2 s on a loaded host)
            print(f"heteropp elastic: world rank {world_rank}: {peer_error(e)}; a peer is gone: this round ends and "
                  "the next re-plans over the chips left", file=sys.stderr, flush=True)
            sys.stdout.flush()
            os._exit(EXIT_PEER)
        raise
    finally:
        RoundHooks.current.close()
        dist.destroy_process_group()
    if rank == 0:
        store.set(f"{prefix}/done", "1")
        record(cfg, "finished")
    if world_rank == 0 and idle:
        _outlive(store, ended, timeout)
    return 0


def _outlive(store: dist.Store, keys: list[str], timeout: datetime.timedelta) -> None:
    """Waits (at most `timeout`) until `keys` are set: the round's end and every other idle rank's reading of it.
    An idle rank that died meanwhile is its agent's to report; this one ends all the same."""
    try:
        store.wait(keys, timeout)
    except dist.DistError:  # a timeout, or the store's connection gone
        pass


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="One elastic HeteroPP rank (for torchrun); see `heteropp run --elastic`.")
    ap.add_argument("--config", required=True, help="the config `heteropp run --elastic --write-config` wrote")
    ap.add_argument("--chip", default=os.environ.get("HETEROPP_CHIP"),
                    help="this host's chip type (a name of the cluster spec; default $HETEROPP_CHIP, else the one "
                         "type whose vendor is the one ditorch selects on this host)")
    a = ap.parse_args(argv)
    with open(a.config) as f:
        data = json.load(f)
    elastic = data.pop("elastic")
    cfg = RunConfig(**data)
    cluster = cluster_from_dict(elastic["cluster"], "<cluster>")
    if not a.chip:
        try:
            vendor = host_vendor(os.environ)  # imports ditorch: in the worker only, never in the fork server
            device = host_device_name(vendor)
            a.chip = host_chip(cluster, cfg.chip_map, vendor, device)
        except SpecError as e:
            print(e, file=sys.stderr)
            return 2
        print(f"heteropp elastic: chip type {a.chip!r}: the type of the cluster spec on this host's ditorch vendor "
              f"{vendor!r} and device {device!r} (no --chip or HETEROPP_CHIP given)", flush=True)
    return run(cfg, cluster, elastic["train"], a.chip,
               int(elastic.get("snapshot_every", 0)), bool(elastic.get("per_replica", False)))


if __name__ == "__main__":
    raise SystemExit(main())
