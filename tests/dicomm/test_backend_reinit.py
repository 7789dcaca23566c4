"""Small contracts of issue 27, point 7: a job re-creates its default group after
destroy_process_group on the same store, whose keys from the first group are still there (store
keys are scoped to the round); a tensor without data (device "meta") handed to the backend is
refused naming its device. (`dist.send` of a meta tensor never reaches any backend: torch's own
Meta kernel of the c10d op answers it, for gloo as well.)"""
from __future__ import annotations

import datetime

import pytest
import torch

from tests.dicomm.multiproc import run_ranks


def _init(rank, ws, store):
    import torch.distributed as dist

    # The same store and the same prefix every time, as a launcher's store would be.
    dist.init_process_group("dicomm", store=dist.PrefixStore("job", store), rank=rank, world_size=ws,
                            timeout=datetime.timedelta(seconds=20))


def _reinit(rank, ws, store, rounds):
    import torch.distributed as dist

    sums = []
    for r in range(rounds):
        _init(rank, ws, store)
        t = torch.full((3,), float(rank + 10 * r))
        dist.all_reduce(t)
        sums.append(t.tolist())
        dist.destroy_process_group()
    return sums


def test_four_ranks_reinitialise_after_destroy_on_the_same_store():
    ws, rounds = 4, 3
    want = [[float(sum(k + 10 * r for k in range(ws)))] * 3 for r in range(rounds)]  # arithmetic
    assert run_ranks(_reinit, ws, rounds, timeout=120) == [want] * ws


def _send_meta(rank, ws, store):
    import torch.distributed as dist

    _init(rank, ws, store)
    out = None
    if rank == 0:
        backend = dist.group.WORLD._get_backend(torch.device("cpu"))
        with pytest.raises((ValueError, RuntimeError)) as info:
            backend.send([torch.empty(4, device="meta")], 1, 0).wait()
        out = str(info.value)
        dist.send(torch.ones(4), 1)  # the group still works
    else:
        t = torch.zeros(4)
        dist.recv(t, 0)
        out = t.tolist()
    dist.destroy_process_group()
    return out


def test_a_meta_tensor_is_refused_naming_its_device():
    err, got = run_ranks(_send_meta, 2, timeout=60)
    assert "meta" in err and "send" in err, err
    assert got == [1.0] * 4


def _meta_through_every_api(rank, ws, store, backend):
    """Each public API with meta tensors: what it answers (or raises), then a real all_reduce."""
    import torch.distributed as dist

    dist.init_process_group(backend, store=store, rank=rank, world_size=ws, timeout=datetime.timedelta(seconds=20))
    peer = 1 - rank

    def meta(n=4):
        return torch.empty(n, device="meta")

    calls = {
        "send/recv": lambda: dist.send(meta(), peer) if rank == 0 else dist.recv(meta(), 0),
        "isend/irecv": lambda: (dist.isend(meta(), peer) if rank == 0 else dist.irecv(meta(), 0)).wait(),
        "batch_isend_irecv": lambda: [w.wait() for w in dist.batch_isend_irecv(
            [dist.P2POp(dist.isend, meta(), peer), dist.P2POp(dist.irecv, meta(), peer)])],
        "all_reduce": lambda: dist.all_reduce(meta()),
        "broadcast": lambda: dist.broadcast(meta(), 0),
        "all_gather": lambda: dist.all_gather([meta(), meta()], meta()),
        "all_gather_single": lambda: dist.all_gather_single(meta(8), meta()),
        "reduce_scatter_single": lambda: dist.reduce_scatter_single(meta(), meta(8)),
        "all_to_all_single": lambda: dist.all_to_all_single(meta(), meta()),
    }
    out = {}
    for name, call in calls.items():
        try:
            call()
            out[name] = "returned"
        except (RuntimeError, ValueError) as e:
            out[name] = f"{type(e).__name__}: {e}"
    t = torch.full((2,), float(rank + 1))
    dist.all_reduce(t)
    out["all_reduce after"] = t.tolist()
    dist.destroy_process_group()
    return out


def test_meta_tensors_through_every_api_behave_as_on_gloo():
    """torch's own Meta kernels answer every c10d call on meta tensors before any backend sees them
    (batch_isend_irecv is refused by torch: no backend for device meta), on gloo as on dicomm; no
    call hangs, and the group works afterwards. Only a call on the backend object itself reaches
    dicomm, which refuses it naming the device (above)."""
    gloo = run_ranks(_meta_through_every_api, 2, "gloo", timeout=90)
    dicomm = run_ranks(_meta_through_every_api, 2, "dicomm", timeout=90)
    assert dicomm == gloo
    assert gloo[0]["all_reduce after"] == [3.0, 3.0]
