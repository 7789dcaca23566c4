"""Host staging of tensors the engine cannot address directly.

Non-contiguous CPU tensors are covered by the collectives and p2p tests (against gloo). The
accelerator path (pinned host buffers ordered with the current stream) runs when a CUDA device is
present: two processes sharing one GPU stand in for two nodes' devices.
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from tests.dicomm.backend_testlib import pack, run_unpacked
from tests.dicomm.multiproc import init_process_group


def _cuda_ranks(rank: int, ws: int, store) -> dict:
    init_process_group("dicomm", rank, ws, store)
    dev = torch.device("cuda", 0)
    out = {}
    x = torch.arange(8, device=dev, dtype=torch.float32) * (rank + 1)
    dist.all_reduce(x)
    out["all_reduce"] = x
    if rank == 0:
        dist.send(torch.arange(5, device=dev, dtype=torch.int64) + 10, 1, tag=4)
    else:
        y = torch.empty(5, device=dev, dtype=torch.int64)
        dist.recv(y, 0, tag=4)
        out["recv"] = y
    g = torch.empty(ws * 3, device=dev)
    dist.all_gather_into_tensor(g, torch.full((3,), float(rank), device=dev))
    out["all_gather"] = g
    torch.cuda.synchronize()
    dist.destroy_process_group()
    return pack(out)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensors_take_the_cpu_mediated_path():
    out = run_unpacked(_cuda_ranks, 2, timeout=120)
    want = torch.arange(8, dtype=torch.float32) * 3
    for r in range(2):
        assert torch.equal(out[r]["all_reduce"], want)
        assert torch.equal(out[r]["all_gather"], torch.tensor([0.0] * 3 + [1.0] * 3))
    assert torch.equal(out[1]["recv"], torch.arange(5) + 10)
