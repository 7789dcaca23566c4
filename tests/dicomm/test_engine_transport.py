"""Per-peer transport choice, forcing, and counters: real processes on one host (so "auto" must
pick shared memory) sharing a real TCPStore."""
import pytest

from tests.dicomm.engine_util import comm, ptr
from tests.dicomm.multiproc import run_ranks


def _choice(rank, world, store, ctor_transport):
    import numpy as np

    c = comm(store, rank, world, transport=ctor_transport)
    before = [c.transport_of(p) for p in range(world)]
    a = np.full(1000, rank, np.uint8)
    b = np.zeros(1000, np.uint8)
    # Rank 0 talks to rank 1 only: rank 2 stays uncontacted from rank 0's point of view.
    if rank == 0:
        c.isend(ptr(a), 1000, 1, tag=1).wait()
        c.irecv(ptr(b), 1000, 1, tag=1).wait()
    elif rank == 1:
        c.irecv(ptr(b), 1000, 0, tag=1).wait()
        c.isend(ptr(a), 1000, 0, tag=1).wait()
    after = [c.transport_of(p) for p in range(world)]
    stats = c.stats()
    store.set(f"done{rank}", "1")
    store.wait([f"done{p}" for p in range(world)])
    c.close()
    return before, after, stats


@pytest.mark.parametrize("ctor,env,expected", [
    ("auto", {}, "shm"),
    ("tcp", {}, "tcp"),
    ("auto", {"DICOMM_TRANSPORT": "tcp"}, "tcp"),
    ("tcp", {"DICOMM_TRANSPORT": "shm"}, "shm"),  # the environment overrides the argument
])
def test_transport_choice_per_peer_and_forcing(ctor, env, expected):
    # Connections on first use (DICOMM_CONNECT=lazy), so that an uncontacted peer stays uncontacted.
    res = run_ranks(_choice, 3, ctor, env={**env, "DICOMM_CONNECT": "lazy"})
    (b0, a0, s0), (b1, a1, s1), (b2, a2, s2) = res
    assert b0 == ["self", "", ""] and a0 == ["self", expected, ""]
    assert a1 == [expected, "self", ""] and a2 == ["", "", "self"]
    assert s0["messages_sent"] == 1 and s0["bytes_sent"] == 1000 and s0["bytes_received"] == 1000
    assert s1["connections_opened"] == 1 and s1["connections_accepted"] >= 1
    assert s0["rejected_connections"] == 0 and s2["messages_received"] == 0


def _bad_transport(rank, world, store):
    import dicomm._C as C

    try:
        comm(store, rank, world)
        return "accepted"
    except C.ValueError as e:
        return str(e)


def test_an_unknown_transport_is_a_value_error():
    text = run_ranks(_bad_transport, 1, env={"DICOMM_TRANSPORT": "carrier-pigeon"})[0]
    assert "carrier-pigeon" in text and "auto, shm or tcp" in text and "DICOMM_TRANSPORT" in text


def _debug_log(rank, world, store):
    import os
    import tempfile

    import numpy as np

    log = tempfile.TemporaryFile()
    saved = os.dup(2)
    os.dup2(log.fileno(), 2)  # the engine logs to fd 2
    c = comm(store, rank, world)
    a = np.zeros(8, np.uint8)
    if rank == 0:
        c.isend(ptr(a), 8, 1, tag=1).wait()
    else:
        c.irecv(ptr(a), 8, 0, tag=1).wait()
    for _ in range(3):
        c.isend(ptr(a), 8, 1 - rank, tag=2).wait()
        c.irecv(ptr(a), 8, 1 - rank, tag=2).wait()
    store.set(f"done{rank}", "1")
    store.wait([f"done{1 - rank}"])
    c.close()
    os.dup2(saved, 2)
    log.seek(0)
    return log.read().decode()


def test_the_choice_is_logged_once_at_debug_level():
    err0, err1 = run_ranks(_debug_log, 2, env={"DICOMM_LOG_LEVEL": "debug"})
    assert err0.count("rank 0 -> rank 1: shm (same host)") == 1
    assert err1.count("rank 1 -> rank 0: shm (same host)") == 1


def _spin_yield(rank, world, store, transport, pin, drop):
    import os

    import numpy as np

    for name in drop:  # what the test runner's own environment might say
        os.environ.pop(name, None)
    if pin:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    cpus = len(os.sched_getaffinity(0))
    c = comm(store, rank, world, transport=transport)
    a = np.zeros(8, np.uint8)
    if rank < 2:  # rank 2 meets nobody
        for _ in range(3):
            c.isend(ptr(a), 8, 1 - rank, tag=1).wait()
            c.irecv(ptr(a), 8, 1 - rank, tag=1).wait()
    stats = c.stats()
    store.set(f"done{rank}", "1")
    store.wait([f"done{p}" for p in range(world)])
    c.close()
    return cpus, stats["local_ranks_known"], stats["spin_yield_every"]


@pytest.mark.parametrize("transport,pin,env", [
    ("auto", False, {}),
    ("auto", True, {}),                       # one CPU for two talking ranks: oversubscribed
    ("tcp", True, {}),                        # a tcp peer on this host counts too (its card says so)
    ("auto", False, {"LOCAL_WORLD_SIZE": "4096"}),  # the launcher's word
    ("auto", True, {"DICOMM_SPIN_YIELD_EVERY": "3"}),  # the setting wins
    ("auto", True, {"DICOMM_SPIN_YIELD_EVERY": "0"}),
])
def test_spinning_callers_yield_only_when_this_hosts_ranks_outnumber_its_cpus(transport, pin, env):
    drop = [k for k in ("LOCAL_WORLD_SIZE", "DICOMM_SPIN_YIELD_EVERY") if k not in env]
    res = run_ranks(_spin_yield, 3, transport, pin, drop, env={**env, "DICOMM_CONNECT": "lazy"})
    for rank, (cpus, known, every) in enumerate(res):
        assert known == (2 if rank < 2 else 1), (rank, known)
        ranks = max(known, int(env.get("LOCAL_WORLD_SIZE", 0)))
        expected = (int(env["DICOMM_SPIN_YIELD_EVERY"]) if "DICOMM_SPIN_YIELD_EVERY" in env
                    else (8 if ranks > cpus else 0))
        assert every == expected, (rank, cpus, known, every)
    if pin:
        assert all(cpus == 1 for cpus, _, _ in res)


def _ping_pong_counting_unspun(rank, world, store):
    import numpy as np

    c = comm(store, rank, world, transport="shm")
    a = np.zeros(8, np.uint8)
    for _ in range(20):
        if rank == 0:
            c.isend(ptr(a), 8, 1, tag=1).wait()
            c.irecv(ptr(a), 8, 1, tag=1).wait()
        else:
            c.irecv(ptr(a), 8, 0, tag=1).wait()
            c.isend(ptr(a), 8, 0, tag=1).wait()
    unspun = c.stats()["waits_unspun"]
    store.set(f"done{rank}", "1")
    store.wait([f"done{1 - rank}"])
    c.close()
    return unspun


@pytest.mark.parametrize("env,blocks", [({}, True), ({"DICOMM_SPIN_CONTENTION": "0"}, False)])
def test_waiters_block_at_once_while_the_host_has_more_runnable_tasks_than_cpus(env, blocks):
    """Busy processes on every CPU (the benchmark's contention helper): a spinning waiter would only
    take the CPU from the peer it waits for, so waits block in epoll at once (counted);
    DICOMM_SPIN_CONTENTION=0 keeps spinning."""
    from dicomm.bench.contention import cpu_hogs

    with cpu_hogs(1):
        unspun = run_ranks(_ping_pong_counting_unspun, 2, env=env, timeout=120)
    assert all((n > 0) == blocks for n in unspun), unspun
