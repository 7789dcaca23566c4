"""Failures are noticed when they happen, not at the timeout: a peer that dies before any
connection toward this rank existed, a peer whose process died while a forked child keeps its
sockets open, a rank that aborts (its peers' pending requests fail, naming it and its reason), a
collective whose send failed while it waits on another rank. Real processes on one host, real
sockets; a dead rank is SIGKILLed. The timeouts are long on purpose: today's code waits them out."""
from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

from tests.dicomm.engine_util import comm, ptr
from tests.dicomm.multiproc import run_ranks

TIMEOUT_S = 10.0


def _outcome(fn) -> tuple[str, str]:
    import dicomm._C as C

    try:
        fn()
        return ("ok", "")
    except C.DicommError as e:
        return (type(e).__name__, str(e))


def _die():
    os.kill(os.getpid(), signal.SIGKILL)


def _dies_before_connecting(rank, world, store):
    c = comm(store, rank, world, timeout_s=TIMEOUT_S)
    if rank == 1:
        store.wait(["posted"])
        _die()
    b = np.zeros(8, np.uint8)
    r = c.irecv(ptr(b), 8, 1, tag=5)  # rank 1 -> rank 0 was never used
    store.set("posted", "1")
    t0 = time.monotonic()
    out = _outcome(r.wait) + (time.monotonic() - t0,)
    c.close()
    return out


def test_peer_dead_before_any_connection_toward_us_is_noticed():
    """Rank 1 is SIGKILLed without ever having sent to rank 0: rank 0's receive fails with
    PeerError naming rank 1 (today: TimeoutError after the whole timeout)."""
    (kind, text, elapsed), _ = run_ranks(_dies_before_connecting, 2, expect_dead=[1])
    assert kind == "PeerError" and "rank 1" in text, (kind, text, elapsed)


def _dies_leaving_a_forked_child(rank, world, store):
    c = comm(store, rank, world, timeout_s=TIMEOUT_S)
    mine, theirs = np.full(8, rank, np.uint8), np.zeros(8, np.uint8)
    r = c.irecv(ptr(theirs), 8, 1 - rank, tag=1)
    c.isend(ptr(mine), 8, 1 - rank, tag=1).wait()
    r.wait()  # connected both ways
    if rank == 1:
        child = os.fork()
        if child == 0:  # inherits every socket and the shared segments, and just sleeps
            time.sleep(3 * TIMEOUT_S)
            os._exit(0)
        store.set("child", str(child))
        store.wait(["posted"])
        _die()
    b = np.zeros(8, np.uint8)
    r = c.irecv(ptr(b), 8, 1, tag=5)
    store.set("posted", "1")
    out = _outcome(r.wait)
    os.kill(int(store.get("child")), signal.SIGKILL)
    c.close()
    return out


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_dead_process_whose_sockets_live_on_in_a_forked_child_is_noticed(transport):
    """Rank 1 forks (a data loader would), then is SIGKILLed: its sockets stay open in the child,
    so no EOF comes; rank 0 watches rank 1's pid and fails the receive naming rank 1."""
    (kind, text), _ = run_ranks(_dies_leaving_a_forked_child, 2, expect_dead=[1],
                                env={"DICOMM_TRANSPORT": transport})
    assert kind == "PeerError" and "rank 1" in text and "exited" in text, (kind, text)


def _abort_reaches_bystanders(rank, world, store):
    c = comm(store, rank, world, timeout_s=TIMEOUT_S)
    out = None
    if rank == 0:  # waits on rank 2, which is alive and simply not sending
        b = np.zeros(8, np.uint8)
        r = c.irecv(ptr(b), 8, 2, tag=5)
        store.set("posted", "1")
        out = _outcome(r.wait)
    elif rank == 1:
        store.wait(["posted"])
        time.sleep(0.2)
        c.abort("the operator stopped the job")
    store.set(f"done{rank}", "1")
    store.wait([f"done{q}" for q in range(world)])
    c.close()
    return out


def test_abort_fails_every_ranks_pending_requests_naming_who_and_why():
    out, _, _ = run_ranks(_abort_reaches_bystanders, 3)
    kind, text = out
    assert kind == "PeerError" and "rank 1 aborted" in text and "the operator stopped the job" in text, out


def _collective_with_a_dead_rank(rank, world, store):
    c = comm(store, rank, world, timeout_s=TIMEOUT_S)
    c.barrier().wait()  # every pair connected
    if rank == 2:
        _die()
    if rank == 1:
        time.sleep(2)  # alive, but late to the collective: its neighbour must not be blamed
    n = 1 << 12
    a = np.ones(n, np.float32)
    store.set(f"start{rank}", "1")
    out = _outcome(lambda: c.all_reduce(ptr(a), n, "float32", "sum").wait())
    c.close()
    return out


def test_collective_failure_blames_the_dead_rank_on_every_survivor():
    """Rank 2 is SIGKILLed; ranks 0 and 1 (one of them late) both fail their all_reduce with
    PeerError naming rank 2, none blames a live neighbour, none waits out the timeout."""
    r0, r1, _ = run_ranks(_collective_with_a_dead_rank, 3, expect_dead=[2])
    for kind, text in (r0, r1):
        assert kind == "PeerError" and "rank 2 is gone" in text, (r0, r1)
        assert "rank 0 is gone" not in text and "rank 1 is gone" not in text, (r0, r1)


def _all_to_all_with_a_dead_rank(rank, world, store):
    c = comm(store, rank, world, timeout_s=TIMEOUT_S)
    c.barrier().wait()
    if rank == 2:
        _die()
    out = None
    if rank == 1:  # posts its receive from rank 0 first, then its send to rank 2 fails
        n = 64
        send, recv = np.ones(3 * n, np.uint8), np.zeros(3 * n, np.uint8)
        slots = [ptr(send) + i * n for i in range(3)], [ptr(recv) + i * n for i in range(3)]
        time.sleep(0.5)  # rank 2 is gone by now
        out = _outcome(lambda: c.all_to_all(slots[0], [n] * 3, slots[1], [n] * 3).wait())
        store.set("done1", "1")
    else:
        store.wait(["done1"])  # rank 0 never joins: rank 1's receive from it would wait forever
    c.close()
    return out


def test_collective_waiting_on_one_rank_notices_its_failed_send_to_another():
    _, out, _ = run_ranks(_all_to_all_with_a_dead_rank, 3, expect_dead=[2])
    kind, text = out
    assert kind == "PeerError" and "rank 2" in text, out


def _late_collective(rank, world, store):
    c = comm(store, rank, world, timeout_s=1.0)
    out = None
    if rank == 0:
        a = np.ones(16, np.float32)
        out = _outcome(lambda: c.all_reduce(ptr(a), 16, "float32", "sum").wait())
        store.set("timed", "1")
    else:
        store.wait(["timed"])  # never joins
    c.close()
    return out


def test_collective_timeout_says_timed_out_and_names_the_peer_and_step():
    (kind, text), _ = run_ranks(_late_collective, 2)
    assert kind == "TimeoutError" and "Timed out" in text, text
    assert "rank 1 never answered step 0" in text, text


def _a_relay_closes_before_the_notice_is_read(rank, world, store):
    c = comm(store, rank, world, timeout_s=TIMEOUT_S)
    for q in range(world):  # every connection up, both ways
        if q != rank:
            mine, theirs = np.full(8, rank, np.uint8), np.zeros(8, np.uint8)
            r = c.irecv(ptr(theirs), 8, q, tag=1)
            c.isend(ptr(mine), 8, q, tag=1).wait()
            r.wait()
    out = None
    if rank == 0:  # waits on rank 1, then is stopped while the others abort and close
        b = np.zeros(8, np.uint8)
        r = c.irecv(ptr(b), 8, 1, tag=5)
        store.set("pid0", str(os.getpid()))
        out = _outcome(r.wait)
    elif rank == 1:  # hears rank 2's abort, passes nothing on, closes
        pid0 = int(store.get("pid0"))
        time.sleep(0.2)
        os.kill(pid0, signal.SIGSTOP)
        store.set("stopped", "1")
        b = np.zeros(8, np.uint8)
        out = _outcome(c.irecv(ptr(b), 8, 2, tag=5).wait)
        c.close()
        os.kill(pid0, signal.SIGCONT)
    else:
        store.wait(["stopped"])
        c.abort("the operator stopped the job")
    return out


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_rank_that_closes_after_an_abort_notice_is_not_blamed_for_it(transport):
    """Rank 2 aborts; rank 1 applies its notice and closes. Rank 0, stopped meanwhile, wakes to both
    at once and meets rank 1's close first (peers are read in rank order): it must report rank 2's
    notice, already waiting on its connection from rank 2, not 'rank 1 is gone'."""
    out = run_ranks(_a_relay_closes_before_the_notice_is_read, 3, env={"DICOMM_TRANSPORT": transport})
    kind, text = out[0]
    assert "rank 1 is gone" not in text, out
    assert kind == "PeerError" and "rank 2 aborted" in text and "the operator stopped the job" in text, out
    assert "rank 2 aborted" in out[1][1], out
