"""`heteropp`: run a plan as a heterogeneous pipeline (`run`) or the same training in one process (`reference`)."""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from .argtypes import above_one, at_least, positive
from .data.cli import add_data_commands
from .plan import SCHEDULES, Plan
from .schedules import ScheduleError
from .spec import Cluster, ModelSpec, SpecError, load_cluster, load_model

# Point-to-point backend between stages when --backend is not given.
DEFAULT_BACKEND = "dicomm"


def parse_chip_map(text: str | None, cluster: Cluster | None) -> dict[str, str]:
    """`A=cpu,B=cuda` and/or a cluster spec's per-chip `device`; the command line wins."""
    out: dict[str, str] = {}
    if cluster:
        out.update({c.name: c.device for c in cluster.chips})
    for item in filter(None, (text or "").split(",")):
        if "=" not in item:
            raise SpecError("--chip-map", item, "not CHIP=VENDOR", "e.g. big=cpu,small=cpu")
        k, v = item.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def override_schedule(plan: Plan, schedule: str) -> None:
    """Run `plan` under another schedule: its parameters belong to the plan's own schedule and go with it
    (a schedule that needs parameters then says which are missing)."""
    if schedule != plan.schedule:
        plan.schedule, plan.schedule_params = schedule, {}


def _summary(label: str, losses: list[float], rates: list[float]) -> None:
    steady = rates[1:] or rates  # the first step pays for warm-up
    print(f"{label}: {len(losses)} steps, final loss {losses[-1]:.6f}, "
          f"{statistics.median(steady):.0f} tokens/s (median)")


def _run_config(plan: Plan, m: ModelSpec, *, recv_window: int | None, **fields):
    """The engine's RunConfig for `plan`; recv_window None keeps RunConfig's default (the engine is imported
    here, not at the top: it pulls in torch)."""
    from .engine import RunConfig
    return RunConfig(plan=plan.to_dict(), model=RunConfig.model_dict(m), **fields,
                     **({} if recv_window is None else {"recv_window": recv_window}))


def zero1_of(a: argparse.Namespace, plan: Plan | None) -> bool:
    """Whether the run shards the optimizer state (ZeRO-1): an explicit --zero1 / --no-zero1 wins, else the
    plan's `zero1` (what HeteroAuto priced it with), else true. A flag against the plan is said on stderr: the
    run then differs from what was priced (optimizer memory, the all-gather)."""
    if a.zero1 is None:
        return plan.zero1 if plan is not None else True
    if plan is not None and a.zero1 != plan.zero1:
        print(f"heteropp: {'--zero1' if a.zero1 else '--no-zero1'} overrides the plan's zero1: "
              f"{str(plan.zero1).lower()}; the run differs from what was priced (optimizer memory and all-gather)",
              file=sys.stderr)
    return a.zero1


def train_options(a: argparse.Namespace, m: ModelSpec, cluster: Cluster | None = None,
                  plan: Plan | None = None) -> dict:
    """TrainOptions fields from the command line, checked before any process starts."""
    from .model.hf_weights import weight_files
    from .spec.hf import hf_config_path, is_hf_config
    from .spec.io import load_mapping
    init_from, original = None, None
    p = Path(a.model)
    if p.exists():
        directory = p if p.is_dir() else p.parent
        data = load_mapping(hf_config_path(p) if p.is_dir() else p)
        original = data if is_hf_config(data) else None  # kept in checkpoints: export writes it back
        if original is not None and not a.fresh_init and weight_files(directory) is not None:
            init_from = str(directory)
    if a.resume and not a.checkpoint_dir:
        raise SpecError("--resume", "checkpoint_dir", "--resume needs --checkpoint-dir", "--checkpoint-dir D")
    if a.reset_optimizer and not a.resume:
        raise SpecError("--reset-optimizer", "resume", "only means something when resuming", "--resume as well")
    if getattr(a, "hosts", None) and not a.elastic:
        raise SpecError("--hosts", "elastic", "emulated hosts are started only by --elastic", "--elastic as well")
    if a.data:
        from .data import TokenData
        TokenData.open(a.data, m.vocab)  # header and vocabulary checked here
    peak = None
    if cluster is not None and plan is not None:
        chips = {c.name: c.peak_tflops for c in cluster.chips}
        peak = sum(chips.get(chip, 0.0) * n for chip, n in plan.chips_used().items()) * 1e12  # every group's
    zero1 = zero1_of(a, plan)
    threshold = getattr(a, "straggler_threshold", None)  # only `run` has it
    if threshold and plan is not None and not a.elastic:  # an elastic run's plans come from HeteroAuto
        stages = plan.stage_names()
        if len(stages) < 2 or any(s.est_time_s is None for _, s in stages):
            raise SpecError("--straggler-threshold", "est_time_s",
                            "the plan has one stage or stages without est_time_s (a hand-written plan): the straggler "
                            "watch has no prediction to judge against, the threshold would do nothing",
                            "a plan of two or more stages from `heteroauto plan --json`, or no --straggler-threshold")
    return {"dtype": a.dtype, "zero1": zero1, "weight_decay": a.weight_decay, "warmup_steps": a.warmup_steps,
            "lr_decay": a.lr_decay, "min_lr": a.min_lr, "init_from": init_from, "data": a.data,
            "checkpoint_dir": a.checkpoint_dir,
            "save_every": a.save_every, "resume": a.resume, "keep_checkpoints": a.keep_checkpoints,
            "reset_optimizer": a.reset_optimizer, "hf_config": original,
            "peak_flops": peak or None, **({"straggler_threshold": threshold} if threshold else {})}


def run_plan(plan: Plan, m: ModelSpec, *, steps: int, schedule: str | None = None, backend: str = DEFAULT_BACKEND,
             chip_map: dict[str, str] | None = None, loss_log: str | None = None, seed: int = 0, lr: float = 3e-3,
             timeout_s: float = 60.0, verbose: bool = False, source: str = "<plan>",
             recv_window: int | None = None, clip_grad: float | None = None, options: dict | None = None) -> dict:
    """Check the plan, launch its processes, train; returns losses and tokens/s of the last stage's lead rank."""
    from .engine import launch
    from .engine.checks import check_run
    if schedule:
        override_schedule(plan, schedule)
    check_run(plan, m, source, chip_map or {}, [plan.schedule])
    cfg = _run_config(plan, m, steps=steps, seed=seed, lr=lr, clip_grad=clip_grad, backend=backend,
                      chip_map=chip_map or {}, loss_log=loss_log, timeout_s=timeout_s, verbose=verbose,
                      recv_window=recv_window, options=options or {})
    t0 = time.perf_counter()
    results = launch(cfg)
    wall = time.perf_counter() - t0
    lead = next(r[plan.schedule] for r in results.values() if r[plan.schedule]["losses"] is not None
                and r[plan.schedule]["coord"][1:] == (0, 0))
    return {"losses": lead["losses"], "tokens_per_s": lead["tokens_per_s"], "wall_s": wall,
            "start_step": lead["start_step"]}


@contextlib.contextmanager
def _launcher_logs_quiet(quiet: bool) -> Iterator[None]:
    """torch elastic logs a failed rank's whole traceback, and torch's spawn each process it stops; `heteropp
    run` says why in one line a rank instead (--verbose keeps them)."""
    loggers = [logging.getLogger(n) for n in ("torch.distributed.elastic.multiprocessing.api",
                                               "torch.multiprocessing.spawn")]
    levels = [log.level for log in loggers]
    if quiet:
        for log in loggers:
            log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for log, level in zip(loggers, levels):
            log.setLevel(level)


def cmd_run(a: argparse.Namespace) -> int:
    plan, m = Plan.load(a.plan), load_model(a.model, a.seq_len)
    cluster = load_cluster(a.cluster) if a.cluster else None
    options = train_options(a, m, cluster, plan)
    chip_map = parse_chip_map(a.chip_map, cluster)
    if finished(a):
        return 0
    if a.elastic:
        return run_elastic(a, plan, m, cluster, chip_map, options)
    available = {c.name: c.count for c in cluster.chips} if cluster else None
    nodes = {c.name: c.nodes for c in cluster.chips if c.nodes} if cluster else None  # the listed ones
    if a.write_config:
        from .engine.checks import check_run
        if a.schedule:
            override_schedule(plan, a.schedule)
        check_run(plan, m, a.plan, chip_map, [plan.schedule], a.world_size, available, nodes)
        from .engine.node_ranks import launch_nodes, ranks_by_node
        # with the cluster's nodes, each torchrun node's workers take the ranks the node rule puts there
        run_nodes = None if cluster is None else \
            launch_nodes(plan, [(c.name, n) for c in cluster.chips for n in c.node_sizes])
        cfg = _run_config(plan, m, steps=a.steps, seed=a.seed, lr=a.lr, clip_grad=a.clip_grad, backend=a.backend,
                          chip_map=chip_map, loss_log=a.loss_log, timeout_s=a.timeout, recv_window=a.recv_window,
                          options=options, nodes=run_nodes,
                          device_names={} if cluster is None else
                          {c.name: c.device_name for c in cluster.chips if c.device_name})
        with open(a.write_config, "w") as f:
            json.dump(cfg.__dict__, f, indent=2)
        secret = "DICOMM_JOB_SECRET=$(python -c 'import secrets; print(secrets.token_hex(16))')"
        if run_nodes is None:
            print(f"wrote {a.write_config}; run it with: {secret} torchrun --nproc-per-node={plan.world_size} "
                  f"-m heteropp.engine.worker --config {a.write_config}")
            return 0
        per_node = ranks_by_node(plan, run_nodes)
        # HETEROPP_CHIP lets a node be matched to its entry by chip type, whatever its group rank (node_ranks.py)
        print(f"wrote {a.write_config}; on node i of these {len(run_nodes)}, with one DICOMM_JOB_SECRET for all "
              "(or, for a c10d rendezvous, --rdzv-backend=c10d --rdzv-endpoint=<host:port> instead of --node-rank "
              "and --master-*: nodes are matched by chip type and process count, whatever order they join in; "
              "with --max-restarts, TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 on every agent: a fresh store every round):")
        for i, ((chip, chips), ranks) in enumerate(zip(run_nodes, per_node)):
            print(f"  node {i} ({chip}, {chips} chips, plan ranks {ranks}): HETEROPP_CHIP={chip} "
                  f"torchrun --nnodes={len(run_nodes)} "
                  f"--node-rank={i} --nproc-per-node={len(ranks)} --master-addr=<node 0's address> "
                  f"--master-port=<port> -m heteropp.engine.worker --config {a.write_config}")
        return 0
    from .engine.checks import check_run
    check_run(plan, m, a.plan, chip_map, [a.schedule or plan.schedule], a.world_size, available, nodes)
    print("heteropp: " + "; ".join(  # every replica group's pipeline (one for a plan of one stage list)
        f"{len(g.stages)} stages "
        + " | ".join(f"{s.chip} tp{s.tp} layers {s.first_layer}-{s.first_layer + s.layers - 1}"
                     + (" rc" if s.recompute else "") for s in g.stages)
        + f", dp {g.dp}, {g.micro_batches} micro-batches" for g in plan.groups)
        + f", {a.schedule or plan.schedule}, p2p {a.backend}, {plan.world_size} processes", flush=True)
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    try:
        with _launcher_logs_quiet(not a.verbose):
            r = run_plan(plan, m, steps=a.steps, schedule=a.schedule, backend=a.backend, chip_map=chip_map,
                         loss_log=a.loss_log, seed=a.seed, lr=a.lr, timeout_s=a.timeout, verbose=a.verbose,
                         source=a.plan, recv_window=a.recv_window, clip_grad=a.clip_grad, options=options)
    except ChildFailedError as e:
        from .engine.launch import failure_lines
        for line in failure_lines(e):
            print(f"heteropp run: error: {line}", file=sys.stderr)
        return 1
    if not r["losses"]:
        print(f"heteropp run: nothing to do: the checkpoint is already at step {r['start_step']} of {a.steps}")
        return 0
    _summary("heteropp run", r["losses"], r["tokens_per_s"])
    if a.loss_log:
        print(f"wrote {a.loss_log}")
    return 0


def run_elastic(a: argparse.Namespace, plan: Plan, m: ModelSpec, cluster: Cluster | None, chip_map: dict[str, str],
                options: dict) -> int:
    """Write the elastic config; then start this machine's emulated hosts, or (--write-config) say how to
    start each real host with torchrun."""
    from .engine.elastic_launch import agent_command, launch_hosts
    from .spec.io import load_mapping
    if cluster is None or not a.checkpoint_dir:
        raise SpecError("--elastic", "--cluster" if cluster is None else "--checkpoint-dir", "missing",
                        "--cluster (the chip types to re-plan over) and --checkpoint-dir (where rounds resume from)")
    train = {"global_batch": plan.global_batch, "micro_batch_size": plan.micro_batch_size, "dtype": a.dtype,
             "zero1": options["zero1"]}  # re-plans price the optimizer as the engine runs it
    if plan.schedule in ("1f1b", "gpipe", "zbh1"):
        train["schedule"] = plan.schedule
    hosts: list[tuple[str, int]] = []
    for item in filter(None, (a.hosts or "").split(",")):
        chip, _, n = item.partition(":")
        if chip not in {c.name for c in cluster.chips} or not n.isdigit() or int(n) < 1:
            raise SpecError("--hosts", item, "not CHIP:PROCESSES with a chip type of the cluster",
                            "e.g. " + ",".join(f"{c.name}:{c.chips_per_node}" for c in cluster.chips))
        hosts.append((chip, int(n)))
    if not hosts:
        hosts = [(c.name, n) for c in cluster.chips for n in c.node_sizes]
        # a host per node: a TP group must sit in one, as `run --cluster` checks (the types listing their nodes)
        plan.placement({c.name: c.nodes for c in cluster.chips if c.nodes}, a.plan)
    options = {**options, "async_save": True}
    cfg = _run_config(plan, m, steps=a.steps, seed=a.seed, lr=a.lr, clip_grad=a.clip_grad, backend=a.backend,
                      chip_map=chip_map, loss_log=a.loss_log, timeout_s=a.timeout, recv_window=a.recv_window,
                      options=options)
    # a plan of replica groups: every round may re-plan replica groups too (the faster of those and one stage list)
    data = {**cfg.__dict__, "elastic": {"cluster": load_mapping(a.cluster), "train": train,
                                        "snapshot_every": a.snapshot_every, "per_replica": bool(plan.replicas)}}
    path = a.write_config or str(Path(a.checkpoint_dir) / "elastic-config.json")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f, indent=1)
    if a.write_config:
        from .engine.elastic_launch import AGENT_ENV
        print(f"wrote {path}; on each host run:")
        cmd = agent_command(path, "<CHIP>", 0, f"1:{len(hosts)}", "<ADDR>:<PORT>", "<RUN_ID>", a.max_restarts)
        env = " ".join(f"{k}={v}" for k, v in AGENT_ENV.items()) + " DICOMM_JOB_SECRET=<one secret for every host>"
        keeper = "python -m heteropp.engine.snapshot_keeper --listen <HOST_ADDR>:0 -- "  # memory snapshots
        print(f"  {env} {keeper}" + " ".join(cmd).replace("--nproc-per-node=0", "--nproc-per-node=<N>"))
        return 0
    print(f"heteropp run --elastic: {len(hosts)} hosts ({', '.join(f'{c} x{n}' for c, n in hosts)}), "
          f"checkpoints in {a.checkpoint_dir}", flush=True)
    from .engine.elastic import EVENTS
    events = Path(a.checkpoint_dir) / EVENTS
    rc = launch_hosts(path, hosts, a.max_restarts, events, agent_logs=a.verbose)
    last = json.loads(events.read_text().splitlines()[-1]) if events.exists() else {}
    if rc and last.get("event") == "no_plan":
        print(f"heteropp: error: no plan fits the chips left ({last['chips']}): {last['error']}", file=sys.stderr)
        return 2
    return rc


def cmd_reference(a: argparse.Namespace) -> int:
    from .engine import train_reference
    from .engine.config import TrainOptions
    m = load_model(a.model, a.seq_len)
    batch = Plan.load(a.plan).global_batch if a.plan else a.global_batch
    opts = TrainOptions(**train_options(a, m))
    if finished(a):
        return 0
    t0 = time.perf_counter()
    r = train_reference(m, a.steps, batch, seed=a.seed, lr=a.lr, loss_log=a.loss_log, clip_grad=a.clip_grad,
                        opts=opts)
    if not r["losses"]:
        print(f"reference: nothing to do: the checkpoint is already at step {r['start_step']} of {a.steps}")
        return 0
    print(f"reference: {len(r['losses'])} steps, final loss {r['losses'][-1]:.6f}, "
          f"{len(r['losses']) * batch * m.seq_len / (time.perf_counter() - t0):.0f} tokens/s")
    if a.loss_log:
        print(f"wrote {a.loss_log}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="heteropp", description="Heterogeneous pipeline-parallel training.")
    sub = ap.add_subparsers(dest="cmd", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--model", required=True, help="model preset (tiny) or spec file")
        p.add_argument("--steps", type=at_least(1), default=10)
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--lr", type=float, default=3e-3)
        p.add_argument(
            "--clip-grad", type=positive, help="clip gradients to this global L2 norm (default: no clipping)"
        )
        p.add_argument("--loss-log",
                       help="JSON lines {\"step\": n, \"loss\": x, ...} (what `precision-diff loss` reads)")
        p.add_argument("--seq-len", type=at_least(1), help="training sequence length (default: the model's; for a "
                       "HuggingFace config its max_position_embeddings)")
        p.add_argument("--fresh-init", action="store_true",
                       help="start from the seed's initialisation even when the model directory holds weights")
        p.add_argument("--data", help="token file from `heteropp data prepare` (default: synthetic tokens)")
        p.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default="fp32",
                       help="weights and activations (bf16/fp16 keep fp32 master weights and optimizer state)")
        p.add_argument("--weight-decay", type=float, default=0.01, help="AdamW's (never on norms and biases)")
        p.add_argument("--zero1", action=argparse.BooleanOptionalAction, default=None,
                       help="--no-zero1: every data-parallel rank keeps the whole optimizer state and applies the "
                       "whole update (a training spec's zero1: false); --zero1: the state sharded over each DP group. "
                       "Default: the plan's zero1 (what it was priced with; true when the plan does not say)")
        p.add_argument("--warmup-steps", type=at_least(0), default=0)
        p.add_argument("--lr-decay", choices=("constant", "linear", "cosine"), default="constant")
        p.add_argument("--min-lr", type=float, default=0.0, help="where the decay ends (at the last step)")
        p.add_argument("--checkpoint-dir", help="write checkpoints (torch.distributed.checkpoint) here")
        p.add_argument("--save-every", type=at_least(0), default=0, help="steps between checkpoints (0: at the end)")
        p.add_argument("--keep-checkpoints", type=at_least(1), default=2)
        p.add_argument("--resume", action="store_true", help="continue from the newest complete checkpoint")
        p.add_argument("--reset-optimizer", action="store_true",
                       help="with --resume: load the weights only (Adam's moments and step start afresh)")

    r = sub.add_parser("run", help="launch the plan's processes on this host and train")
    r.add_argument("--plan", required=True, help="plan JSON (from `heteroauto plan --json` or hand-written)")
    common(r)
    r.add_argument("--schedule", choices=SCHEDULES, help="override the plan's schedule")
    r.add_argument("--backend", choices=("dicomm", "gloo"), default=DEFAULT_BACKEND,
                   help=f"point-to-point between stages (default {DEFAULT_BACKEND})")
    r.add_argument("--chip-map", help="plan chip type -> ditorch vendor, e.g. big=cpu,small=cuda")
    r.add_argument("--cluster", help="cluster spec whose chips' `device` fields give the chip map")
    r.add_argument("--world-size", type=int, help="reject the plan unless it uses exactly this many ranks")
    r.add_argument("--timeout", type=positive, default=60.0, help="seconds any send, receive or collective may take")
    r.add_argument("--recv-window", type=at_least(0),
                   help="receives each stage posts ahead of the one it waits for; bounds its receive buffers "
                   "(default: RunConfig.recv_window, 4)")
    r.add_argument("--write-config", help="write the run config for `torchrun -m heteropp.engine.worker` and exit")
    r.add_argument("--elastic", action="store_true",
                   help="survive lost chips: re-plan (HeteroAuto, the cluster spec's chip types, the plan's global "
                   "batch; replica groups too when the plan is one of them) and resume from the newest checkpoint at "
                   "every membership change; needs --cluster and --checkpoint-dir")
    r.add_argument("--hosts", help="with --elastic on this machine: emulated hosts as CHIP:PROCESSES,... "
                   "(default: the cluster spec's nodes)")
    r.add_argument("--max-restarts", type=at_least(0), default=3, help="with --elastic: restarts per host agent")
    r.add_argument("--snapshot-every", type=at_least(0), default=1,
                   help="with --elastic: every this many steps each rank's state is also held in memory by its "
                   "host's and the next host's snapshot keeper, and a round resumes from there when it is at least "
                   "as new as the disk checkpoint (default 1; 0: off)")
    r.add_argument("--straggler-threshold", type=above_one,
                   help="report a stage as a straggler when its compute is this many times slower than predicted, "
                   "relative to the other stages, over a window of steps (default 1.5; raise it on hosts whose speed "
                   "varies on its own)")
    r.add_argument("-v", "--verbose", action="store_true",
                   help="one line per rank: stage, TP/DP position, device; a failed rank's whole traceback")
    r.set_defaults(fn=cmd_run)

    f = sub.add_parser("reference", help="the same training in one process, no parallelism")
    common(f)
    f.add_argument("--global-batch", type=int, default=8, help="sequences per step (default 8)")
    f.add_argument("--plan", help="take the global batch from this plan")
    f.set_defaults(fn=cmd_reference)

    e = sub.add_parser("export", help="write a checkpoint as a HuggingFace model directory")
    e.add_argument("--checkpoint", required=True, help="a checkpoint directory (step-N/) or the --checkpoint-dir "
                   "holding them (its newest complete one)")
    e.add_argument("--out", required=True, help="output directory (config.json, model.safetensors)")
    e.add_argument("--tokenizer", help="tokenizer.json (or a directory holding it) to copy beside the weights")
    e.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default="fp32", help="dtype of the written weights")
    e.set_defaults(fn=cmd_export)
    tr = sub.add_parser("trace", help="a per-stage timeline (Chrome trace) from a run's HETEROPP_TIMING spans")
    tr.add_argument("--timing", required=True, help="the directory HETEROPP_TIMING named")
    tr.add_argument("--out", required=True, help="trace JSON for chrome://tracing or Perfetto")
    tr.set_defaults(fn=cmd_trace)
    add_data_commands(sub)
    return ap


def cmd_trace(a: argparse.Namespace) -> int:
    from .engine.trace import chrome_trace
    trace = chrome_trace(a.timing)
    with open(a.out, "w") as f:
        json.dump(trace, f)
    print(f"wrote {a.out}: {sum(e['ph'] == 'X' for e in trace['traceEvents'])} actions")
    return 0


def cmd_export(a: argparse.Namespace) -> int:
    from .engine.export import export_hf
    out = export_hf(a.checkpoint, a.out, a.tokenizer, a.dtype)
    print(f"wrote {out}")
    return 0


def finished(a: argparse.Namespace) -> bool:
    """--resume of a run whose newest checkpoint is already at --steps: say so instead of starting processes."""
    if not (a.resume and a.checkpoint_dir):
        return False
    from .engine.checkpoint import complete_checkpoints
    done = complete_checkpoints(a.checkpoint_dir)
    step = int(done[-1].name.split("-")[1]) if done else 0
    if step >= a.steps:
        print(f"heteropp {a.cmd}: nothing to do: the checkpoint is already at step {step} of {a.steps}")
    return step >= a.steps


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    try:
        return a.fn(a)
    except (SpecError, ScheduleError) as e:
        print(f"heteropp: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("heteropp: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        # Ctrl-C reaches the launcher as torch elastic's SignalException once it has stopped the workers
        if type(e).__name__ == "SignalException":
            print(f"heteropp: stopped by a signal ({e})", file=sys.stderr)
            return 130
        raise
