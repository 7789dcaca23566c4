"""Training frameworks on dicomm: DDP and torch.distributed.pipelining match one process.

Processes on one host stand in for nodes; CPU tensors stand in for device tensors. The reference
is the same model trained in the test process on the whole batch: DDP's averaged gradients and a
pipeline's micro-batch-averaged gradients both equal the whole-batch mean loss's gradients.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from tests.dicomm.backend_testlib import pack, run_unpacked
from tests.dicomm.multiproc import init_process_group

BATCH, D_IN, D_HID, D_OUT = 16, 6, 8, 3


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return torch.randn(BATCH, D_IN, generator=g), torch.randn(BATCH, D_OUT, generator=g)


def _model() -> nn.Sequential:
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(D_IN, D_HID), nn.Tanh(), nn.Linear(D_HID, D_OUT))


def _ddp(rank: int, ws: int) -> list[torch.Tensor]:
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = DDP(_model(), bucket_cap_mb=1e-4)  # tiny buckets: several all_reduces per step
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = _data()
    part = slice(rank * BATCH // ws, (rank + 1) * BATCH // ws)
    for _ in range(3):
        opt.zero_grad()
        nn.functional.mse_loss(model(x[part]), y[part]).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def _pipeline(rank: int, ws: int, schedule: str) -> list[torch.Tensor]:
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
    full = _model()
    part = full[:2] if rank == 0 else full[2:]
    stage = PipelineStage(part, rank, ws, torch.device("cpu"))
    cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule]
    sched = cls(stage, n_microbatches=4, loss_fn=nn.functional.mse_loss)
    x, y = _data()
    if rank == 0:
        sched.step(x)
    else:
        sched.step(target=y)
    return [p.grad.detach().clone() for p in part.parameters()]


def _train(rank: int, ws: int, store, backend: str) -> dict:
    init_process_group(backend, rank, ws, store)
    out = {"ddp": _ddp(rank, ws), "gpipe": _pipeline(rank, ws, "gpipe"),
           "1f1b": _pipeline(rank, ws, "1f1b")}
    dist.destroy_process_group()
    return pack(out)


def _reference() -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(parameters after 3 whole-batch SGD steps, gradients of one whole-batch step)."""
    x, y = _data()
    model = _model()
    nn.functional.mse_loss(model(x), y).backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return [p.detach() for p in model.parameters()], grads


def test_ddp_and_pipeline_schedules_match_a_single_process():
    ranks = run_unpacked(_train, 2, "dicomm", timeout=120)
    params, grads = _reference()
    for rank in range(2):
        for got, want in zip(ranks[rank]["ddp"], params, strict=True):
            torch.testing.assert_close(got, want)
    for schedule in ("gpipe", "1f1b"):
        got = ranks[0][schedule] + ranks[1][schedule]  # stage 0 holds layer 0, stage 1 layer 2
        for g, want in zip(got, grads, strict=True):
            torch.testing.assert_close(g, want, msg=lambda m, schedule=schedule: f"{schedule}: {m}")
