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
