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
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import datetime
import json
import os
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

EVENTS = "elastic.jsonl"


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


def replan(cluster: Cluster, m: ModelSpec, train: dict[str, Any]) -> Plan:
    """HeteroAuto's plan for the chips present; InfeasibleError names what is missing."""
    from ..auto.planning import make_problem, run_search, to_plan
    pb = make_problem(cluster, m, train_from_dict(train, "<training>", m.seq_len))
    t0 = time.perf_counter()
    res = run_search(pb)
    return to_plan(pb, res.best, time.perf_counter() - t0, "auto")


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
    """World ranks in plan-rank order: each stage's ranks from the not yet taken ranks of its chip type."""
    free: dict[str, list[int]] = collections.defaultdict(list)
    for r, c in enumerate(chips):
        free[c].append(r)
    order = []
    for k, s in enumerate(plan.stages[:plan.devices]):
        need = plan.stage_ranks(k)
        if len(free[s.chip]) < need:
            raise InfeasibleError(f"the plan needs {need} more {s.chip} chips than are present")
        order += free[s.chip][:need]
        del free[s.chip][:need]
    return order


def run(cfg: RunConfig, cluster: Cluster, train: dict[str, Any], chip: str) -> int:
    world_rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    started = time.time()
    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=cfg.timeout_s)
    dist.init_process_group("gloo", timeout=timeout)  # the control group: torch's env:// rendezvous
    store = dist.distributed_c10d._get_default_store()
    chips: list[Any] = [None] * world
    dist.all_gather_object(chips, chip)
    m = cfg.model_spec
    decided: list[Any] = [None]
    if world_rank == 0:
        t0 = time.perf_counter()
        try:
            plan = replan(live_cluster(cluster, chips), m, train)
            decided[0] = {"plan": plan.to_dict(), "round": uuid.uuid4().hex, "plan_s": time.perf_counter() - t0}
        except (InfeasibleError, SpecError) as e:
            decided[0] = {"error": f"{e}; the smallest cluster that fits: {smallest_fit(cluster, m, train)}"}
    dist.broadcast_object_list(decided, 0)
    dist.destroy_process_group()
    if "error" in decided[0]:
        # no plan fits what is left: the round fails before touching the checkpoint (the agents retry until
        # their restarts are spent or a host joins; `heteropp run --elastic` then reports this error)
        if world_rank == 0:
            record(cfg, "no_plan", chips=dict(collections.Counter(chips)), error=decided[0]["error"])
        raise SystemExit(f"heteropp elastic: no plan for the chips present: {decided[0]['error']}")
    plan = Plan.from_dict(decided[0]["plan"])
    order = assign(plan, chips)
    cfg = dataclasses.replace(cfg, plan=plan.to_dict(), chip_map={**{c.name: c.device for c in cluster.chips},
                                                                  **cfg.chip_map})
    done = complete_checkpoints(cfg.opts.checkpoint_dir) if cfg.opts.checkpoint_dir else []
    cfg.options = {**cfg.options, "resume": bool(done)}
    prefix = f"heteropp/{decided[0]['round']}"
    if world_rank not in order:  # idle in this plan: wait for the round's end (or be restarted by the agent)
        store.wait([f"{prefix}/done"], datetime.timedelta(days=365))
        return 0
    rank = order.index(world_rank)
    if rank == 0:
        rounds = sum(1 for e in _read_events(cfg) if e.get("event") == "round") + 1
        root = Path(cfg.opts.checkpoint_dir or ".")
        root.mkdir(parents=True, exist_ok=True)  # torchrun on a host: nothing made it before
        plan.save(root / f"plan-round{rounds}.json")
        record(cfg, "round", round=rounds, started=round(started, 3), chips=dict(collections.Counter(chips)),
               world=world,
               plan=[f"{s.chip} tp{s.tp} x{s.layers}" + (f" dp{s.inner_dp}" if s.inner_dp > 1 else "")
                     for s in plan.stages] + [f"dp {plan.dp}"], ranks=plan.world_size,
               plan_s=round(decided[0]["plan_s"], 4),
               resume_from=int(done[-1].name.split("-")[1]) if done else 0)
    if cfg.backend == "dicomm":
        import dicomm  # noqa: F401  registers the backend
    dist.init_process_group(cfg.backend, store=dist.PrefixStore(prefix, store), rank=rank,
                            world_size=plan.world_size, timeout=timeout)
    from .worker import _is_peer_failure, run_rank
    try:
        run_rank(cfg, plan, rank)
    except Exception as e:
        if _is_peer_failure(e):
            record(cfg, "peer_failure", rank=world_rank, error=str(e).splitlines()[0][:300])
        raise
    finally:
        dist.destroy_process_group()
    if rank == 0:
        store.set(f"{prefix}/done", "1")
        record(cfg, "finished")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="One elastic HeteroPP rank (for torchrun); see `heteropp run --elastic`.")
    ap.add_argument("--config", required=True, help="the config `heteropp run --elastic --write-config` wrote")
    ap.add_argument("--chip", default=os.environ.get("HETEROPP_CHIP"),
                    help="this host's chip type (a name of the cluster spec; default $HETEROPP_CHIP)")
    a = ap.parse_args(argv)
    with open(a.config) as f:
        data = json.load(f)
    elastic = data.pop("elastic")
    if not a.chip:
        raise SystemExit("heteropp elastic: give this host's chip type with --chip or HETEROPP_CHIP")
    cfg = RunConfig(**data)
    return run(cfg, cluster_from_dict(elastic["cluster"], "<cluster>"), elastic["train"], a.chip)


if __name__ == "__main__":
    raise SystemExit(main())
