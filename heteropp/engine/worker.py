"""One process of a plan: join the job, build this rank's stage and groups, train, report.

`heteropp run` starts these through torch's elastic launcher; across machines run the same entry point
with torchrun: `torchrun --nnodes=N --nproc-per-node=M ... -m heteropp.engine.worker --config run.json`.
"""
from __future__ import annotations

import argparse
import hashlib
import dataclasses
import datetime
import json
import logging
import os
import signal
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

from ..model import StageModel
from ..model.grads import grad_of
from ..plan import Plan
from ..spec.errors import SpecError
from .config import RunConfig
from .build import TORCH_DTYPES, build_chunks, make_optimizer, resume
from .build import schedule as schedule_lr
from .checkpoint import Checkpointer, slots
from .data import Batches
from .executor import StageExecutor
from .metrics import StepLog, mark_stage_start, stage_peaks
from .node_gather import gather_nodes
from .node_ranks import torchrun_rank, unsure_nodes
from .snapshot import RoundHooks
from .straggler import StragglerWatch
from .tied import sync_tied_grads
from .p2p import P2P
from .schedule import compile_schedule
from .replica_groups import GroupPlan, HolderGroups, build_holder_groups, group_of, group_plans, sum_holder_grads
from .topology import Groups, build_groups, stage_groups

log = logging.getLogger("heteropp")


def _shards(models: list[StageModel], grad: bool) -> dict[str, tuple[torch.Tensor, int | None, int]]:
    """name -> (this rank's gradient or weight, TP shard dimension or None, TP ranks sharing that shard), over
    the stage's chunks (names carry global layer indices): what a test needs to line the shard up with the
    reference's full tensor."""
    return {n: ((grad_of(p) if grad else p).detach().cpu().clone(), p.shard_dim, getattr(p, "tp_replicas", 1))
            for model in models for n, p in model.named_parameters()}


def _owned(p: torch.nn.Parameter, tp_rank: int) -> bool:
    """Whether this TP rank counts p in the global gradient norm: a full copy on every rank (norms) counts
    on TP rank 0, a slice shared by a replica set (key/value heads) on the set's first rank."""
    if p.shard_dim is None:
        return tp_rank == 0
    return tp_rank % getattr(p, "tp_replicas", 1) == 0


def train(cfg: RunConfig, plan: Plan, g: Groups, schedule: str | list[list[str]], rank: int,
          ckpt_pg: Any = None, hg: HolderGroups | None = None) -> dict[str, Any]:
    """`hg`: this rank's place in a plan of replica groups (replica_groups.py), `plan` then its group's."""
    m, opts = cfg.model_spec, cfg.opts
    k, d, t = g.coord.stage, g.coord.replica, g.coord.tp_rank
    st = plan.stages[k]
    rows = plan.micro_batch_size // st.inner_dp  # this replica's slice of every micro-batch
    first_row = g.coord.inner * rows
    n, p = len(plan.stages), plan.devices
    mark_stage_start()
    chunks = build_chunks(m, [(plan.stages[vs].layer_range, vs == 0, vs == n - 1, plan.stages[vs].recompute)
                              for vs in range(k, n, p)], g.tp, cfg.seed, opts, g.device)
    model = chunks[-1]  # the chunk that holds the head on the last stage
    named = [(name, q) for c in chunks for name, q in c.named_parameters()]
    tied_copy = m.tie_embeddings and n > 1  # the last stage's head is a copy of the embedding
    owned = [_owned(q, t) and not (tied_copy and name == "head.weight") for name, q in named]
    if hg is None:
        opt = make_optimizer(named, cfg.lr, opts, cfg.clip_grad, g.dp, d, plan.stage_dp(k), owned,
                             dist.get_world_size() > 1)
    elif opts.zero1:  # each holder keeps the state of its shard of each part (holder_optim.py)
        opt = make_optimizer(named, cfg.lr, opts, cfg.clip_grad, owned=owned, distributed=dist.get_world_size() > 1,
                             holders=hg)
    else:  # whole optimizer state on every holder; the norm counts the first group's first replica
        opt = make_optimizer(named, cfg.lr, opts, cfg.clip_grad, None, 0, 1,
                             [o and hg.index == 0 and d == 0 for o in owned], dist.get_world_size() > 1)
    sched = schedule_lr(cfg.lr, cfg.steps, opts)
    ckpt = None
    if opts.checkpoint_dir:
        writes = d == 0 and (hg is None or hg.index == 0)  # one replica of each stage (of the first group)
        ckpt = Checkpointer(opts.checkpoint_dir, m, slots(named, m, t, st.tp, writes, tied_copy), ckpt_pg,
                            opts.keep_checkpoints, opts.async_save)
    hooks = RoundHooks.current  # an elastic round's (memory snapshots, phase times); None otherwise
    source = hooks.source(ckpt) if hooks is not None and ckpt is not None else ckpt
    start = resume(opt, source, opts) if source is not None and opts.resume else 0
    p2p = P2P(rank, k, cfg.timeout_s, g.p2p_cpu)
    ex = StageExecutor(chunks, plan, g, p2p, (rows, m.seq_len, m.hidden), cfg.recv_window,
                       act_dtype=TORCH_DTYPES[opts.dtype])
    if rank == cfg.slow_rank:
        ex.delay_s = cfg.slow_s
    # every replica group's stages together
    watch = StragglerWatch(plan if hg is None else cfg.plan_obj, threshold=opts.straggler_threshold)
    slot = watch.slot_of(0 if hg is None else hg.index, k)
    actions = compile_schedule(plan, schedule)[k]
    label = schedule if isinstance(schedule, str) else "custom"
    lead = model.last and d == 0 and t == 0 and (hg is None or hg.index == 0)
    global_batch = plan.global_batch if hg is None else hg.micro_batches * plan.micro_batch_size
    seq_base = 0 if hg is None else hg.seq_base
    # the loss is a mean over this rank's rows of every micro-batch, scaled so that every rank holding
    # a stage's parameters sums to the global mean: micro-batches of the whole plan times inner replicas
    shares = plan.micro_batches * plan.stage_dp(k) if hg is None else hg.micro_batches * st.inner_dp
    path = cfg.loss_log
    if path and len(cfg.schedule_list()) > 1:  # one log per schedule: run.jsonl -> run.zbh1.jsonl
        stem, dot, ext = path.rpartition(".")
        path = f"{stem}.{label}.{ext}" if dot else f"{path}.{label}"
    log = StepLog(path if lead else None, start, m, global_batch, cfg.steps, label, opts.peak_flops, echo=lead)
    if hg is not None:  # the watch's slots run over every group's stages
        log.slot_names = [f"group {i} stage {j}" for i, j in watch.where]
    losses, rates, norms = [], [], []
    grads: list[dict[str, tuple[torch.Tensor, int | None, int]]] | None = [] if cfg.collect_grads else None
    tokens = global_batch * m.seq_len
    data = Batches(m, cfg.seed, global_batch, opts.data)
    for step in range(start + 1, cfg.steps + 1):
        if rank == cfg.fail_rank and step == cfg.fail_step:
            if cfg.fail_kill:
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError(f"rank {rank}: injected failure at step {step}")
        t0 = time.perf_counter()
        mbs = []
        for i in range(plan.micro_batches):
            lo = seq_base + (g.coord.outer * plan.micro_batches + i) * plan.micro_batch_size + first_row
            mbs.append(data.rows(step, lo, lo + rows))
        opt.zero_grad()
        opt.lr = sched.at(step)
        scale = opt.scaler.scale if opt.scaler is not None else 1.0
        loss = ex.run(actions, [b[:, :-1] for b in mbs], [b[:, 1:] for b in mbs], scale / shares) / scale
        if tied_copy:
            sync_tied_grads(named, g, d)
        if grads is not None:
            grads.append(_shards(chunks, grad=True))
        if hg is not None:
            sum_holder_grads(named, hg, g.tp)
        opt.step()
        norms.append(opt.last_norm)
        if model.last:
            total = torch.tensor([loss], dtype=torch.float64)
            if hg is not None:
                dist.all_reduce(total, group=hg.loss)
            elif plan.stage_dp(k) > 1:
                dist.all_reduce(total, group=g.dp)
            loss = total.item()
        peaks = stage_peaks(g, plan, k, d == 0 and t == 0) if cfg.loss_log and hg is None else None
        if hooks is not None:
            hooks.wait()  # the previous step's snapshot is sent before the all-reduce below lets this step count
        slow = watch.observe(slot, ex.compute_s, d == 0 and t == 0)
        if ckpt is not None:
            ckpt.settle()  # the previous step's checkpoint is complete before this step counts as done
        dt = time.perf_counter() - t0
        losses.append(loss)
        rates.append(tokens / dt)
        log.step(step, loss, opt.lr, opt.last_norm, dt, peaks, opt.scaler, slow)
        trainer = {"opt_step": opt.t, "seed": cfg.seed, "dtype": opts.dtype, "data": opts.data,
                   "hf_config": opts.hf_config, "lr_schedule": dataclasses.asdict(sched),
                   "loss_scale": opt.scaler.scale if opt.scaler else None,
                   "skipped": opt.scaler.skipped if opt.scaler else 0}
        if hooks is not None and ckpt is not None:
            hooks.after_step(step, opt, ckpt, trainer)
        if ckpt is not None:
            if step == cfg.steps or (opts.save_every and step % opts.save_every == 0):
                ckpt.save(step, opt.full_state(), trainer)
    if ckpt is not None:
        ckpt.wait()
    log.close()
    params = _shards(chunks, grad=False) if cfg.collect_params else None
    return {"coord": (k, d, t), "group": 0 if hg is None else hg.index, "device": g.device.type,
            "losses": losses if model.last else None,
            "tokens_per_s": rates, "grads": grads, "params": params, "grad_norms": norms,
            "bytes_sent": dict(p2p.bytes_sent), "start_step": start,
            # which job secret this rank's backend used, as a digest (tests: fresh for every job)
            "secret_digest": hashlib.sha256(os.environ.get("DICOMM_JOB_SECRET", "").encode()).hexdigest()[:12],
            # torch's huge-page allocator at work in this rank (launch sets THP_MEM_ALLOC_ENABLE)
            "huge_page_tensors": _huge_pages_advised(torch.empty(1 << 20)),
            "skipped_steps": opt.scaler.skipped if opt.scaler else 0,
            # elements of Adam's first moment this rank keeps: 1/dp of its stage's under ZeRO-1 (of each part's,
            # 1/its holders, in replica groups), else all
            "optim_state_elems": opt.state_elems()}


def _huge_pages_advised(tensor: torch.Tensor) -> bool:
    """Whether the mapping holding `tensor` is advised for transparent huge pages ("hg" in its VmFlags)."""
    address, inside = tensor.data_ptr(), False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(" ", 1)[0]
            if "-" in head and not head.endswith(":"):  # a mapping's first line: "start-end perms ..."
                start, end = (int(x, 16) for x in head.split("-"))
                inside = start <= address < end
            elif inside and head == "VmFlags:":
                return "hg" in line.split()[1:]
    return False


def worker(cfg: RunConfig) -> dict[str, Any]:
    """Entry point of every rank (RANK, WORLD_SIZE, MASTER_ADDR/PORT come from the launcher)."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    timeout = datetime.timedelta(seconds=cfg.timeout_s)
    store = None
    if cfg.nodes is not None:  # torchrun: the rank the node rule gives this worker's node, whatever it arrived as
        try:
            store, seen = gather_nodes(os.environ, rank, world, timeout)
            rank = torchrun_rank(cfg.plan_obj, cfg.nodes, os.environ, seen, cfg.chip_map, cfg.device_names)
            node = int(os.environ["GROUP_RANK"])
            unsure = unsure_nodes(cfg.plan_obj, cfg.nodes, seen, cfg.chip_map, cfg.device_names)
            if node in unsure and os.environ.get("LOCAL_RANK") == "0":
                print(f"heteropp worker: warning: node {node} (torchrun group rank) does not say its chip type and "
                      f"its {os.environ['LOCAL_WORLD_SIZE']} processes fit nodes of types {unsure[node]}: it runs "
                      "what its group rank leaves it; set HETEROPP_CHIP on every host, or give those types a "
                      f"device_name in the cluster spec (this host's device: {seen[node].device!r})",
                      file=sys.stderr, flush=True)
        except SpecError as e:  # the launch does not match the config's nodes: say which, no traceback
            print(f"heteropp worker: error: {e}", file=sys.stderr, flush=True)
            raise SystemExit(2) from None
    # Ctrl-C reaches every rank with the launcher: stop at once, quietly (a checkpoint being written stays
    # .partial; the launcher says why it stopped)
    signal.signal(signal.SIGINT, lambda *_: os._exit(128 + signal.SIGINT))
    torch.set_num_threads(1)  # ranks share the host's cores
    logging.basicConfig(level=logging.INFO if cfg.verbose else logging.WARNING, format="%(name)s: %(message)s")
    plan = cfg.plan_obj
    m = cfg.model_spec
    plan.validate("plan", num_layers=m.layers, heads=m.heads, kv_heads=m.kv_heads, ffn=m.ffn, vocab=m.vocab,
                  world_size=world)
    if cfg.job_secret:
        os.environ["DICOMM_JOB_SECRET"] = cfg.job_secret
    if cfg.backend == "dicomm":
        import dicomm  # noqa: F401  registers the backend
    # the store the nodes met over, as init_process_group's env:// would scope it
    dist.init_process_group(backend=cfg.backend, rank=rank, world_size=world, timeout=timeout,
                            store=None if store is None else dist.PrefixStore("default_pg", store))
    try:
        return run_rank(cfg, plan, rank)
    except Exception as e:
        if _is_peer_failure(e):
            # The launcher blames the first rank it sees exit; let the rank that failed first be that one.
            time.sleep(PEER_FAILURE_GRACE_S)
        raise
    finally:
        dist.destroy_process_group()


def run_rank(cfg: RunConfig, plan: Plan, rank: int) -> dict[str, Any]:
    """This rank's whole run once the default process group holds the plan's ranks: groups, training for each
    schedule, the closing barrier; a result per schedule."""
    m = cfg.model_spec
    timeout = datetime.timedelta(seconds=cfg.timeout_s)
    hg = None
    if plan.replicas:
        groups = group_plans(plan)
        index = group_of(groups, rank)
        for gp in groups[:index]:  # every rank creates every group's groups, in order
            stage_groups(gp, rank, cfg.chip_map, cfg.timeout_s)
        plan, rest = groups[index], groups[index + 1:]
    # a group's ends are tied across every group (HolderGroups.tie), not inside the group alone
    g = build_groups(plan, rank, cfg.chip_map, cfg.backend, cfg.timeout_s,
                     tied=m.tie_embeddings and not isinstance(plan, GroupPlan))
    if isinstance(plan, GroupPlan):
        for gp in rest:
            stage_groups(gp, rank, cfg.chip_map, cfg.timeout_s)
        hg = build_holder_groups(cfg.plan_obj, groups, rank, cfg.backend, cfg.timeout_s, m.tie_embeddings)
    # checkpoints talk over their own group: DCP's background thread must not share the training's
    ckpt_pg = dist.new_group(backend="gloo", timeout=timeout) if cfg.opts.checkpoint_dir else None
    st = plan.stages[g.coord.stage]
    log.info("rank %d: stage %d (%s, layers %d-%d%s) tp %d/%d dp %d/%d on %s, p2p %s", rank, g.coord.stage,
             st.chip, st.first_layer, st.first_layer + st.layers - 1, ", recompute" if st.recompute else "",
             g.coord.tp_rank, st.tp, g.coord.replica, plan.stage_dp(g.coord.stage), g.device, cfg.backend)
    out = {(s if isinstance(s, str) else "custom"): train(cfg, plan, g, s, rank, ckpt_pg, hg)
           for s in cfg.schedule_list()}
    dist.barrier()
    return out


PEER_FAILURE_GRACE_S = 2.0
_PEER_FAILURE_TEXT = ("closed by peer", "connection reset", "peer closed", "peer is gone", "broken pipe")


def _is_peer_failure(e: BaseException) -> bool:
    """True for errors that only report another rank's death (gloo's or dicomm's wording)."""
    if type(e).__name__ == "PeerError":
        return True
    text = str(e).lower()
    return any(t in text for t in _PEER_FAILURE_TEXT)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="One HeteroPP rank (for torchrun); see `heteropp run`.")
    ap.add_argument("--config", required=True, help="RunConfig JSON written by `heteropp run --write-config`")
    a = ap.parse_args(argv)
    with open(a.config) as f:
        worker(RunConfig(**json.load(f)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
