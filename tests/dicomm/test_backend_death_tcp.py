"""A peer SIGKILLed in the middle of batch_isend_irecv over tcp is noticed within 2 s by every
survivor, in every run (issue 27, point 6: one run in three took 18-19 s)."""
from __future__ import annotations

import os
import signal
import time

import pytest
import torch

from tests.dicomm.multiproc import init_process_group, run_ranks

RUNS = int(os.environ.get("DICOMM_DEATH_RUNS", "3"))
BOUND_S = 2.0


def _killed_in_batch(rank, ws, store, run):
    import torch.distributed as dist

    import dicomm

    os.environ["DICOMM_TRANSPORT"] = "tcp"
    init_process_group("dicomm", rank, ws, store, timeout_s=30)
    n = 1 << 18  # 1 MiB: rendezvous messages, data still moving when the peer dies
    send, recv = torch.full((n,), float(rank)), torch.empty(n)
    right, left = (rank + 1) % ws, (rank - 1) % ws
    out = {"took": None, "error": "never noticed"}
    for i in range(1000):
        if rank == 2 and i == 3 + run:
            ops = [dist.P2POp(dist.isend, send, right), dist.P2POp(dist.irecv, recv, left)]
            dist.batch_isend_irecv(ops)  # posted, not waited for
            store.set("killed_at", repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        ops = [dist.P2POp(dist.isend, send, right), dist.P2POp(dist.irecv, recv, left)]
        try:
            for w in dist.batch_isend_irecv(ops):
                w.wait()
        except dicomm.DicommError as e:
            out = {"took": time.time() - float(store.get("killed_at").decode()), "error": f"{type(e).__name__}: {e}"}
            break
        assert recv[0].item() == float(left) and recv[-1].item() == float(left)
    # A survivor that returned would exit and close its communicator; the other survivor, not yet done,
    # would then rightly report that survivor gone instead of rank 2. So each stays until both have
    # recorded what they saw, noticed or not (bounded by the store's timeout).
    if store.add("done", 1) == ws - 1:
        store.set("all_done", "1")
    store.wait(["all_done"])
    return out


@pytest.mark.parametrize("run", range(RUNS))
def test_a_peer_killed_in_batch_isend_irecv_over_tcp_is_noticed_within_2s(run):
    out = run_ranks(_killed_in_batch, 3, run, timeout=90, expect_dead=[2])
    for rank in (0, 1):
        r = out[rank]
        assert r["took"] is not None and r["took"] <= BOUND_S, f"rank {rank}: {r}"
        assert "rank 2" in r["error"], r["error"]


def _batch_with_a_dead_peer_behind_a_live_one(rank, ws, store, poll):
    import torch.distributed as dist

    import dicomm

    os.environ["DICOMM_TRANSPORT"] = "tcp"
    init_process_group("dicomm", rank, ws, store, timeout_s=30)
    out = None
    if rank == 0:
        # The send to rank 1 (alive, never receiving) comes first in the batch; the receive from
        # rank 2 (about to die) second: the batch must fail when rank 2 goes, not at the timeout.
        ops = [dist.P2POp(dist.isend, torch.ones(1 << 18), 1), dist.P2POp(dist.irecv, torch.empty(1 << 18), 2)]
        works = dist.batch_isend_irecv(ops)
        store.set("posted", "1")
        start = time.time()
        try:
            for w in works:
                while poll and not w.is_completed() and time.time() - start < 40:
                    time.sleep(0.001)
                w.wait()
            out = {"took": time.time() - start, "error": "completed"}
        except dicomm.DicommError as e:
            out = {"took": time.time() - start, "error": f"{type(e).__name__}: {e}"}
        store.set("rank0_done", "1")
    elif rank == 2:
        store.wait(["posted"])
        os.kill(os.getpid(), signal.SIGKILL)
    else:
        store.wait(["rank0_done"])
    return out


@pytest.mark.parametrize("poll", [False, True], ids=["wait", "poll is_completed"])
def test_a_batch_fails_at_its_first_failure_not_at_a_request_ahead_of_it(poll):
    out = run_ranks(_batch_with_a_dead_peer_behind_a_live_one, 3, poll, timeout=90, expect_dead=[2])
    r = out[0]
    assert "rank 2" in r["error"] and r["took"] <= BOUND_S, r
