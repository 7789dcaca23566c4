"""Real torch.distributed clients, each run the same way on gloo and on dicomm.

Every scenario is a function of (rank, world size, backend, scratch dir) returning tensors or plain
values; the tests run them in real processes on both backends and compare (gloo is the
reference). Keys starting with '~' are float results compared with torch's default tolerances.
"""
from __future__ import annotations

import datetime
import os
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

D = 8


def _model(seed: int = 3) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(D, 16), nn.ReLU(), nn.Linear(16, D))


def _batch(rank: int, n: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(n, D, generator=g), torch.randn(n, D, generator=g)


def _params(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def _train(model: nn.Module, rank: int, steps: int = 3, no_sync_every: int = 0) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(steps):
        x, y = _batch(rank * 10 + step)
        opt.zero_grad()
        if no_sync_every and step % no_sync_every == 0:
            with model.no_sync():
                nn.functional.mse_loss(model(x), y).backward()
            x, y = _batch(rank * 10 + step + 5)
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()


# ----------------------------------------------------------------------------- c10d semantics

def all_gather_coalesced(rank: int, ws: int) -> Any:
    inputs = [torch.tensor([10.0 * rank + i]) for i in range(ws)]
    outputs = [[torch.empty(1) for _ in range(ws)] for _ in range(ws)]
    dist.all_gather_coalesced(outputs, inputs)
    return [t for lst in outputs for t in lst]


def sparse_all_reduce(rank: int, ws: int) -> Any:
    i = torch.tensor([[0, 2, rank + 3], [1, rank, 0]])
    v = torch.tensor([1.0 + rank, 2.0, 3.0 * rank])
    s = torch.sparse_coo_tensor(i, v, (6, 3))
    dist.all_reduce(s)
    return s.to_dense()


def monitored_barrier(rank: int, ws: int) -> Any:
    dist.group.WORLD.monitored_barrier(datetime.timedelta(seconds=20))
    pg = dist.new_group(list(range(ws)))  # a failed barrier may leave its group unusable (gloo's)
    if rank != 1:  # rank 1 stays away: the others must name it, within the timeout
        try:
            pg.monitored_barrier(datetime.timedelta(seconds=2), wait_all_ranks=True)
            return "passed without rank 1"
        except RuntimeError as e:
            text = str(e)
            return "names rank 1" if "1" in text and "monitoredBarrier" in text else text
    return "stayed away"


# ----------------------------------------------------------------------------- DDP

def ddp_variants(rank: int, ws: int) -> Any:
    from torch.nn.parallel import DistributedDataParallel as DDP
    out = {}
    m = DDP(_model(), bucket_cap_mb=1e-4)
    _train(m, rank, no_sync_every=2)
    out["~buckets_no_sync"] = _params(m)
    base = _model()
    extra = nn.Linear(D, D)  # never used: find_unused_parameters must cope

    class WithUnused(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.base, self.extra = base, extra

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.base(x)

    m = DDP(WithUnused(), find_unused_parameters=True)
    _train(m, rank)
    out["~find_unused"] = _params(m)
    m = DDP(_model(), static_graph=True)
    _train(m, rank)
    out["~static_graph"] = _params(m)
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    m = DDP(_model())
    m.register_comm_hook(None, default_hooks.fp16_compress_hook)
    _train(m, rank)
    out["~fp16_hook"] = _params(m)
    return out


def ddp_powersgd(rank: int, ws: int) -> Any:
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
    from torch.nn.parallel import DistributedDataParallel as DDP
    m = DDP(_model())
    state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                               start_powerSGD_iter=2, min_compression_rate=0.5)
    m.register_comm_hook(state, psgd.powerSGD_hook)
    _train(m, rank, steps=5)
    return _params(m)


def ddp_sparse_embedding(rank: int, ws: int) -> Any:
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.manual_seed(5)
    emb = nn.Embedding(20, 4, sparse=True)
    m = DDP(emb)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for step in range(3):
        idx = torch.tensor([rank + step, 7, 3 * rank + 1])
        opt.zero_grad()
        m(idx).pow(2).sum().backward()
        opt.step()
    return _params(m)


def ddp_compiled(rank: int, ws: int) -> Any:
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch._dynamo.reset()
    m = DDP(_model())
    compiled = torch.compile(m, backend="aot_eager")
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    for step in range(2):
        x, y = _batch(rank * 10 + step)
        opt.zero_grad()
        nn.functional.mse_loss(compiled(x), y).backward()
        opt.step()
    return _params(m)


def c10d_in_compiled_function(rank: int, ws: int) -> Any:
    torch._dynamo.reset()

    def f(x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        dist.all_reduce(y)
        dist.broadcast(y, 1)
        dist.barrier()
        return y + 1

    return torch.compile(f, backend="aot_eager", fullgraph=False)(torch.arange(4.0) + rank)


def functional_collectives(rank: int, ws: int) -> Any:
    import torch.distributed._functional_collectives as funcol
    torch._dynamo.reset()
    group = dist.group.WORLD

    def f(x: torch.Tensor) -> list[torch.Tensor]:
        a = funcol.all_reduce(x, "sum", group)
        b = funcol.all_gather_tensor(x, 0, group)
        c = funcol.reduce_scatter_tensor(torch.cat([x] * ws), "sum", 0, group)
        return [a, b, c]

    x = torch.arange(4.0) * (rank + 1)
    eager = f(x)
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)(x)
    return eager + compiled


# ----------------------------------------------------------------------------- FSDP, DTensor, DCP

def fsdp2(rank: int, ws: int, hsdp: bool = False) -> Any:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh("cpu", (2, ws // 2) if hsdp else (ws,),
                            mesh_dim_names=("rep", "shard") if hsdp else ("shard",))
    m = _model()
    for layer in m:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(m, mesh=mesh)
    _train(m, rank)
    return [p.full_tensor().detach().clone() for p in m.parameters()]


def dtensor_tp(rank: int, ws: int) -> Any:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    mesh = init_device_mesh("cpu", (ws,))
    m = parallelize_module(_model(), mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    x, _ = _batch(0)  # TP: every rank sees the same batch
    out = m(x)
    out.sum().backward()
    return [out.detach()] + [p.grad.full_tensor() for p in m.parameters()]


def dcp_async_save_and_load(rank: int, ws: int, scratch: str) -> Any:
    import torch.distributed.checkpoint as dcp
    m = _model(seed=11)
    path = os.path.join(scratch, "dcp")
    fut = dcp.async_save({"model": m.state_dict()}, checkpoint_id=path)
    fut.result(timeout=60)
    target = {"model": _model(seed=12).state_dict()}
    dcp.load(target, checkpoint_id=path)
    return list(target["model"].values())


def broadcast_from_rank0(rank: int, ws: int) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh("cpu", (ws,))
    m = _model(seed=rank + 20)
    fully_shard(m, mesh=mesh)
    full = _model(seed=30).state_dict() if rank == 0 else {}
    set_model_state_dict(m, full, options=StateDictOptions(full_state_dict=True,
                                                           broadcast_from_rank0=True))
    return [p.full_tensor().detach().clone() for p in m.parameters()]


def fsdp1_sharded_state_dict(rank: int, ws: int) -> Any:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import StateDictType
    m = FSDP(_model(), device_id=torch.device("cpu"))
    _train(m, rank, steps=2)
    with FSDP.state_dict_type(m, StateDictType.SHARDED_STATE_DICT):
        sd = m.state_dict()
    # ShardedTensors: this rank's shards (compared rank by rank)
    return {k: [s.tensor.clone() for s in v.local_shards()] for k, v in sd.items()}


# ----------------------------------------------------------------------------- groups, pipelining

def subgroups_and_reinit(rank: int, ws: int, backend: str, store: Any) -> Any:
    sub, _ = dist.new_subgroups(group_size=2)
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t, group=sub)
    dist.destroy_process_group()
    dist.init_process_group(backend=backend, store=dist.PrefixStore("again", store), rank=rank,
                            world_size=ws, timeout=datetime.timedelta(seconds=120))
    u = torch.tensor([float(rank)])
    dist.all_reduce(u)
    return [t, u]


def pipelining(rank: int, ws: int) -> Any:
    from torch.distributed.pipelining import (PipelineStage, ScheduleInterleaved1F1B,
                                              ScheduleInterleavedZeroBubble)
    out = {}
    for name, cls in [("interleaved", ScheduleInterleaved1F1B),
                      ("zero_bubble", ScheduleInterleavedZeroBubble)]:
        torch.manual_seed(9)
        layers = [nn.Linear(D, D) for _ in range(2 * ws)]
        mine = [rank, rank + ws]  # two virtual stages per rank
        stages = [PipelineStage(layers[i], i, 2 * ws, torch.device("cpu")) for i in mine]
        sched = cls(stages, n_microbatches=4, loss_fn=nn.functional.mse_loss)
        x, y = _batch(0, n=8)
        if rank == 0:
            sched.step(x)
        elif rank == ws - 1:
            sched.step(target=y)
        else:
            sched.step()
        out["~" + name] = [layers[i].weight.grad.clone() for i in mine]
    return out


SCENARIOS_2: dict[str, Callable[..., Any]] = {
    "all_gather_coalesced": all_gather_coalesced, "sparse_all_reduce": sparse_all_reduce,
    "monitored_barrier": monitored_barrier,
    "ddp_variants": ddp_variants, "ddp_powersgd": ddp_powersgd,
    "ddp_sparse_embedding": ddp_sparse_embedding, "ddp_compiled": ddp_compiled,
    "c10d_in_compiled_function": c10d_in_compiled_function,
    "functional_collectives": functional_collectives, "fsdp2": fsdp2, "dtensor_tp": dtensor_tp,
    "broadcast_from_rank0": broadcast_from_rank0, "fsdp1_sharded_state_dict": fsdp1_sharded_state_dict,
    "pipelining": pipelining, "dcp_async_save_and_load": dcp_async_save_and_load,
}
