"""Failures surface as clear exceptions, within the process group's timeout; nothing hangs.

Processes on one host stand in for nodes; a rank that leaves with os._exit stands in for a crashed
node. Every check runs inside the ranks, which raise (and so fail the run) when an error is
missing, late, or silent about what went wrong.
"""
from __future__ import annotations

import datetime
import os
import re
import time

import pytest
import torch
import torch.distributed as dist

from tests.dicomm.multiproc import init_process_group, run_ranks

TIMEOUT_S = 3.0  # the group timeout whose expiry is under test
# Everything else runs in groups with a timeout no stall of a loaded host reaches, so a late peer
# cannot turn an expected error into a TimeoutError, and "well before the timeout" has a margin.
PATIENT_TIMEOUT = datetime.timedelta(seconds=60)


def _raises(exc: type, patterns: list[str], fn, *args, **kwargs) -> float:
    """Runs fn, requires exc whose text matches every pattern; returns the seconds it took."""
    start = time.monotonic()
    with pytest.raises(exc) as info:
        fn(*args, **kwargs)
    for pattern in patterns:
        assert re.search(pattern, str(info.value), re.I), f"unclear error: {info.value}"
    return time.monotonic() - start


def _timeouts(rank: int, store, patient) -> None:
    import dicomm
    if rank == 0:
        t = torch.zeros(4)
        took = _raises(dicomm.TimeoutError, [r"recv", r"rank 1\b", r"tag 9\b", r"\b16\b"],
                       dist.recv, t, 1, tag=9)
        assert TIMEOUT_S * 0.9 <= took < TIMEOUT_S + 10, f"group timeout honoured? took {took:.1f}s"
        # A future has the group's timeout as its deadline too, and fails with the same error.
        fut = dist.irecv(torch.zeros(4), 1, tag=11).get_future()
        took = _raises(dicomm.TimeoutError, [r"Timed out", r"tag 11\b"], fut.wait)
        assert took < TIMEOUT_S + 10, f"the future outlived the group timeout: {took:.1f}s"
        w = dist.irecv(t, 1, tag=10, group=patient)
        took = _raises(dicomm.TimeoutError, [r"tag 10\b"], w.wait, datetime.timedelta(seconds=0.3))
        limit = PATIENT_TIMEOUT.total_seconds() / 4
        assert took < limit, f"wait(timeout) ignored its timeout: {took:.1f}s"
        # The unmatched receive was withdrawn: waiting again fails at once.
        _raises(dicomm.TimeoutError, [r"tag 10\b"], w.wait)
        assert w.is_completed() and isinstance(w.exception(), dist.DistBackendError)
        assert "Timed out" in str(w.exception())
        # Its message comes late (111), then the next one (222): the next receive gets 222, and
        # 111 lands nowhere (neither in the abandoned tensor nor in the next receive).
        store.set("send-now", "1")
        fresh = torch.empty(4)
        dist.recv(fresh, 1, tag=10, group=patient)
        assert torch.equal(fresh, torch.full((4,), 222.0)), fresh
        assert torch.equal(t, torch.zeros(4)), t
    else:
        store.wait(["send-now"])
        dist.send(torch.full((4,), 111.0), 0, tag=10, group=patient)
        dist.send(torch.full((4,), 222.0), 0, tag=10, group=patient)


def _p2p_mismatches(rank: int, patient) -> None:
    import dicomm
    if rank == 0:
        _raises(dicomm.MismatchError, [r"rank 1\b", r"tag 1\b", r"\b64\b", r"\b32\b"],
                dist.recv, torch.empty(8), 1, tag=1, group=patient)  # 64-byte message, 32-byte tensor
        _raises(dicomm.MismatchError, [r"rank 1\b", r"tag 2\b", r"\b16\b", r"\b32\b"],
                dist.recv, torch.empty(8), 1, tag=2, group=patient)  # 16-byte message, 32-byte tensor
    else:
        try:  # the sender may or may not hear about the receiver's refusal
            dist.send(torch.ones(16), 0, tag=1, group=patient)
        except dicomm.DicommError:
            pass
        dist.send(torch.ones(4), 0, tag=2, group=patient)
    # The group still works afterwards.
    t = torch.full((3,), float(rank))
    if rank == 0:
        dist.send(t, 1, tag=3, group=patient)
    else:
        dist.recv(t, 0, tag=3, group=patient)
        assert torch.equal(t, torch.zeros(3))


def _invalid_ranks() -> None:
    _raises(ValueError, [r"send", r"invalid.*rank 5"], dist.send, torch.ones(2), 5)
    _raises(ValueError, [r"broadcast", r"invalid.*rank 9"], dist.broadcast, torch.ones(2), 9)
    _raises(ValueError, [r"tag -4"], dist.isend, torch.ones(2), 1, tag=-4)
    # Coalesced operations pair outputs with inputs one to one; a count mismatch names both counts.
    pg = dist.distributed_c10d._get_default_group()
    _raises(ValueError, [r"all_gather_into_tensor_coalesced", r"got 1 outputs for 2 inputs"],
            pg.allgather_into_tensor_coalesced, [torch.empty(4)], [torch.ones(2), torch.ones(2)])
    _raises(ValueError, [r"reduce_scatter_tensor_coalesced", r"got 2 outputs for 1 inputs"],
            pg.reduce_scatter_tensor_coalesced, [torch.empty(1), torch.empty(1)], [torch.ones(2)])


def _failures(rank: int, ws: int, store) -> str:
    init_process_group("dicomm", rank, ws, store, timeout_s=TIMEOUT_S)
    patient = dist.new_group([0, 1], timeout=PATIENT_TIMEOUT)
    _timeouts(rank, store, patient)
    _p2p_mismatches(rank, patient)
    _invalid_ranks()
    dist.destroy_process_group()
    return "ok"


def test_timeouts_mismatches_and_invalid_arguments_raise_clear_errors():
    assert run_ranks(_failures, 2, timeout=60) == ["ok", "ok"]


def _outcome(fn, *args, **kwargs) -> tuple[str, str, float]:
    start = time.monotonic()
    try:
        fn(*args, **kwargs)
        return "no error", "", time.monotonic() - start
    except Exception as e:  # reported to the test process, which judges it
        return type(e).__name__, str(e), time.monotonic() - start


def _collective_mismatches(rank: int, ws: int, store) -> dict:
    init_process_group("dicomm", rank, ws, store, timeout_s=PATIENT_TIMEOUT.total_seconds())
    out = {}
    g = dist.new_group([0, 1], timeout=PATIENT_TIMEOUT)  # a fresh group per case: a failed one may be spent
    dtype = torch.float32 if rank == 0 else torch.int32  # same byte count, different dtype
    out["dtype"] = _outcome(dist.all_reduce, torch.ones(8, dtype=dtype), group=g)
    g = dist.new_group([0, 1], timeout=PATIENT_TIMEOUT)
    out["size"] = _outcome(dist.all_gather_single, torch.empty(2 * (4 + rank)),
                           torch.ones(4 + rank), group=g)
    return out


@pytest.fixture(scope="module")
def mismatches() -> list[dict]:
    return run_ranks(_collective_mismatches, 2, timeout=60)


@pytest.mark.parametrize("case", ["dtype", "size"])
def test_a_collective_mismatch_fails_every_rank_with_a_clear_error(mismatches, case):
    for rank in range(2):
        kind, text, took = mismatches[rank][case]
        assert kind == "MismatchError", f"rank {rank}: {kind} after {took:.1f}s: {text}"
        assert re.search(r"all_reduce.*(float32|int32)" if case == "dtype" else r"all_gather",
                         text), text


PEER_TIMEOUT_S = 8.0


def _peer_dies(rank: int, ws: int, store) -> str:
    import dicomm
    init_process_group("dicomm", rank, ws, store, timeout_s=PEER_TIMEOUT_S)
    dist.barrier()
    big = 16 << 20
    if rank == 2:  # starts a large transfer and dies in the middle of it
        dist.isend(torch.ones(big // 4), 0, tag=1)
        time.sleep(0.05)
        os._exit(17)
    start = time.monotonic()
    if rank == 0:
        t = torch.zeros(big // 4)
        try:
            dist.recv(t, 2, tag=1)  # may have arrived whole before the crash: then it is intact
            assert torch.equal(t, torch.ones(big // 4)), "partial message delivered as complete"
        except dicomm.DicommError:
            pass
    with pytest.raises(dicomm.DicommError) as info:
        dist.all_reduce(torch.ones(4))  # rank 2 never joins
    took = time.monotonic() - start
    assert took < PEER_TIMEOUT_S + 10, f"took {took:.1f}s to notice a dead peer"
    return f"{type(info.value).__name__} after {took:.1f}s: {info.value}"


def test_a_dead_peer_fails_pending_operations_on_every_other_rank():
    out = run_ranks(_peer_dies, 3, timeout=60, expect_dead=[2])
    assert out[2] is None
    for rank in (0, 1):  # the engine notices the closed connection: no waiting out the timeout
        assert out[rank].startswith("PeerError") and "is gone" in out[rank], out[rank]


def _ddp_peer_killed(rank: int, ws: int, store) -> str:
    import signal

    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    init_process_group("dicomm", rank, ws, store, timeout_s=PEER_TIMEOUT_S)
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64)), bucket_cap_mb=1e-3)
    x = torch.randn(8, 64)
    model(x).sum().backward()  # a good step first: every connection is up
    dist.barrier()
    loss = model(x).sum()
    # every rank is through this forward's collectives (DDP rebuilds its buckets in its second forward and
    # broadcasts them) before rank 2 may die: once, under the parallel suite, rank 1 still waited for rank 0's
    # part of that broadcast when rank 3's abort notice came, and raised outside the backward judged here
    dist.barrier()
    if rank == 2:
        # Dies mid-backward: the last layer's gradients are computed and their bucket's all_reduce
        # is under way when the first layer's gradient hook kills the process.
        model.module[0].weight.register_hook(lambda grad: os.kill(os.getpid(), signal.SIGKILL))
    start = time.monotonic()
    try:
        loss.backward()
        return "no error"
    except Exception as e:  # the test process judges it
        return f"{type(e).__name__} after {time.monotonic() - start:.1f}s: {e}"


def test_ddp_survivors_of_a_killed_peer_get_an_exception_naming_it():
    """Before: DDP's reducer read the failed future's value and the survivors segfaulted."""
    # 4 ranks: survivors next to the dead rank and survivors that hear of it through a neighbour's
    # abort. (Before: with 4 ranks, 2 runs in 4 had rank 1 blame rank 3, whose connection closed
    # before its abort notice was read.)
    out = run_ranks(_ddp_peer_killed, 4, timeout=90, expect_dead=[2])
    for rank in (0, 1, 3):
        assert out[rank] is not None, f"rank {rank} died instead of raising"
        assert re.match(r"(DistBackendError|PeerError) after", out[rank]), out[rank]
    # Every survivor names the dead rank: those waiting on it directly, and those that hear of a
    # neighbour's abort, whose notice carries the reason (not "rank 3 is gone").
    for rank in (0, 1, 3):
        assert re.search(r"rank 2\b", out[rank]), out[rank]


# torch's own barrier-timeout test matches a timeout by this (distributed_test.py, _test_barrier_timeout)
TORCH_TIMEOUT_WORDING = r" (Timed out|closed|timeout) "


def _barrier_timeouts(rank: int, ws: int, store) -> list[str]:
    init_process_group("dicomm", rank, ws, store, timeout_s=PATIENT_TIMEOUT.total_seconds())
    groups = [dist.new_group([0, 1], timeout=datetime.timedelta(seconds=1)) for _ in range(2)]
    texts = []
    if rank == 0:
        # Two deadlines race: the collective's own (from its start) and the caller's wait (from the
        # call). Waiting late makes the first pass first; waiting at once lets the second.
        for group, wait_after_s in zip(groups, (0.5, 0.0)):
            work = dist.barrier(group, async_op=True)
            time.sleep(wait_after_s)
            with pytest.raises(Exception) as info:
                work.wait()
            texts.append(str(info.value))
        store.set("rank0-done", "1")
    else:
        store.wait(["rank0-done"])  # never joins the barriers
    dist.destroy_process_group()
    return texts


def test_a_barrier_timeout_is_worded_alike_whichever_deadline_passes_first():
    texts = run_ranks(_barrier_timeouts, 2, timeout=60)[0]
    for text in texts:
        assert re.search(TORCH_TIMEOUT_WORDING, text), text
        assert "barrier" in text, text


def _absent_peer(rank: int, ws: int, store) -> str:
    """Rank 1 never creates its group: rank 0's first all_reduce cannot even connect to it."""
    if rank == 1:
        return ""
    import dicomm
    init_process_group("dicomm", rank, ws, store, timeout_s=TIMEOUT_S)
    with pytest.raises(dicomm.TimeoutError) as info:
        dist.all_reduce(torch.ones(4))
    return str(info.value)


def test_a_collective_stuck_connecting_names_the_peer_whose_card_never_came():
    """Its timeout says why it never started: the peer's address card is not in the store."""
    text = run_ranks(_absent_peer, 2, timeout=60)[0]
    assert re.search(TORCH_TIMEOUT_WORDING, text), text
    assert re.search(r"rank 1 (has not|never) published its address card", text), text
