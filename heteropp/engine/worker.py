"""One process of a plan: join the job, build this rank's stage and groups, train, report.

`heteropp run` starts these through torch's elastic launcher; across machines run the same entry point
with torchrun: `torchrun --nnodes=N --nproc-per-node=M ... -m heteropp.engine.worker --config run.json`.
"""
from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import time
from typing import Any

import torch
import torch.distributed as dist

from ..model import StageModel
from ..plan import Plan
from .config import RunConfig
from .data import global_batch, micro_batch
from .executor import StageExecutor
from .optim import ZeroAdamW
from .p2p import P2P
from .schedule import compile_schedule
from .topology import Groups, build_groups

log = logging.getLogger("heteropp")


def _shards(models: list[StageModel], grad: bool) -> dict[str, tuple[torch.Tensor, int | None, int]]:
    """name -> (this rank's gradient or weight, TP shard dimension or None, TP ranks sharing that shard), over
    the stage's chunks (names carry global layer indices): what a test needs to line the shard up with the
    reference's full tensor."""
    return {n: ((p.grad if grad else p).detach().cpu().clone(), p.shard_dim, getattr(p, "tp_replicas", 1))
            for model in models for n, p in model.named_parameters()}


def _owned(p: torch.nn.Parameter, tp_rank: int) -> bool:
    """Whether this TP rank counts p in the global gradient norm: a full copy on every rank (norms) counts
    on TP rank 0, a slice shared by a replica set (key/value heads) on the set's first rank."""
    if p.shard_dim is None:
        return tp_rank == 0
    return tp_rank % getattr(p, "tp_replicas", 1) == 0


def train(cfg: RunConfig, plan: Plan, g: Groups, schedule: str | list[list[str]], rank: int) -> dict[str, Any]:
    m = cfg.model_spec
    k, d, t = g.coord.stage, g.coord.replica, g.coord.tp_rank
    st = plan.stages[k]
    rows = plan.micro_batch_size // st.inner_dp  # this replica's slice of every micro-batch
    first_row = g.coord.inner * rows
    n, p = len(plan.stages), plan.devices
    chunks = [StageModel(m, plan.stages[vs].layer_range, g.tp, seed=cfg.seed, first=vs == 0, last=vs == n - 1,
                         recompute=plan.stages[vs].recompute).to(g.device) for vs in range(k, n, p)]
    model = chunks[-1]  # the chunk that holds the head on the last stage
    params = [q for c in chunks for q in c.parameters()]
    opt = ZeroAdamW(params, cfg.lr, g.dp, d, plan.stage_dp(k), clip_norm=cfg.clip_grad,
                    owned=[_owned(p, t) for p in params], distributed_norm=dist.get_world_size() > 1)
    p2p = P2P(rank, k, cfg.timeout_s, g.p2p_cpu)
    ex = StageExecutor(chunks, plan, g, p2p, (rows, m.seq_len, m.hidden), cfg.recv_window)
    actions = compile_schedule(plan, schedule)[k]
    label = schedule if isinstance(schedule, str) else "custom"
    lead = model.last and d == 0 and t == 0
    path = cfg.loss_log
    if path and len(cfg.schedule_list()) > 1:  # one log per schedule: run.jsonl -> run.zbh1.jsonl
        stem, dot, ext = path.rpartition(".")
        path = f"{stem}.{label}.{ext}" if dot else f"{path}.{label}"
    log_file = open(path, "w") if lead and path else None
    losses, rates, norms = [], [], []
    grads: list[dict[str, tuple[torch.Tensor, int | None, int]]] | None = [] if cfg.collect_grads else None
    tokens = plan.global_batch * m.seq_len
    for step in range(1, cfg.steps + 1):
        if rank == cfg.fail_rank:
            raise RuntimeError(f"rank {rank}: injected failure at step {step}")
        t0 = time.perf_counter()
        batch = global_batch(m, cfg.seed, step, plan.global_batch)
        mbs = [
            micro_batch(batch, g.coord.outer, plan.micro_batches, plan.micro_batch_size, i)[
                first_row : first_row + rows
            ]
            for i in range(plan.micro_batches)
        ]
        opt.zero_grad()
        # the loss is a mean over this replica's rows: scaled so that the stage's replicas sum to the global mean
        loss = ex.run(actions, [b[:, :-1] for b in mbs], [b[:, 1:] for b in mbs],
                      1.0 / (plan.micro_batches * plan.stage_dp(k)))
        if grads is not None:
            grads.append(_shards(chunks, grad=True))
        opt.step()
        norms.append(opt.last_norm)
        if model.last:
            total = torch.tensor([loss], dtype=torch.float64)
            if plan.stage_dp(k) > 1:
                dist.all_reduce(total, group=g.dp)
            loss = total.item()
        dt = time.perf_counter() - t0
        losses.append(loss)
        rates.append(tokens / dt)
        if lead:
            print(f"[{label}] step {step:4d}  loss {loss:.6f}  {tokens / dt:9.0f} tokens/s", flush=True)
            if log_file:
                log_file.write(json.dumps({"step": step, "loss": loss}) + "\n")
                log_file.flush()
    if log_file:
        log_file.close()
    params = _shards(chunks, grad=False) if cfg.collect_params else None
    return {"coord": (k, d, t), "device": g.device.type, "losses": losses if model.last else None,
            "tokens_per_s": rates, "grads": grads, "params": params, "grad_norms": norms,
            "bytes_sent": dict(p2p.bytes_sent)}


def worker(cfg: RunConfig) -> dict[str, Any]:
    """Entry point of every rank (RANK, WORLD_SIZE, MASTER_ADDR/PORT come from the launcher)."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)  # ranks share the host's cores
    logging.basicConfig(level=logging.INFO if cfg.verbose else logging.WARNING, format="%(name)s: %(message)s")
    plan = cfg.plan_obj
    m = cfg.model_spec
    plan.validate("plan", num_layers=m.layers, heads=m.heads, kv_heads=m.kv_heads, ffn=m.ffn, vocab=m.vocab,
                  world_size=world)
    if cfg.backend == "dicomm":
        import dicomm  # noqa: F401  registers the backend
    timeout = datetime.timedelta(seconds=cfg.timeout_s)
    dist.init_process_group(backend=cfg.backend, rank=rank, world_size=world, timeout=timeout)
    try:
        g = build_groups(plan, rank, cfg.chip_map, cfg.backend, cfg.timeout_s)
        st = plan.stages[g.coord.stage]
        log.info("rank %d: stage %d (%s, layers %d-%d%s) tp %d/%d dp %d/%d on %s, p2p %s", rank, g.coord.stage,
                 st.chip, st.first_layer, st.first_layer + st.layers - 1, ", recompute" if st.recompute else "",
                 g.coord.tp_rank, st.tp, g.coord.replica, plan.stage_dp(g.coord.stage), g.device, cfg.backend)
        out = {(s if isinstance(s, str) else "custom"): train(cfg, plan, g, s, rank) for s in cfg.schedule_list()}
        dist.barrier()
        return out
    except Exception as e:
        if _is_peer_failure(e):
            # The launcher blames the first rank it sees exit; let the rank that failed first be that one.
            time.sleep(PEER_FAILURE_GRACE_S)
        raise
    finally:
        dist.destroy_process_group()


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
