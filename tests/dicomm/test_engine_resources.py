"""Bounded resources: a flood of silent connections does not use up a rank's descriptors (a new
communicator still comes up under a 256-file limit), rejections are logged at a bounded rate, and
unmatched eager messages are bounded by the senders' credits instead of growing the receiver
without bound. Real processes on one host, real TCP and Unix sockets."""
from __future__ import annotations

import os
import resource
import socket
import tempfile
import time

import numpy as np
import pytest

from tests.dicomm.engine_util import close_pair, comm, exchange, ptr
from tests.dicomm.multiproc import run_ranks


def _tcp_address(store, rank: int, prefix: str = "") -> tuple[str, int]:
    text = store.get(f"{prefix}dicomm/card/{rank}").decode()
    card = dict(line.split("=", 1) for line in text.splitlines() if line)
    host, port = card["addr.tcp"].rsplit(":", 1)
    return host, int(port)


def _flooded(rank, world, store, silent):
    import torch.distributed as dist

    if rank == 1:  # the victim runs with a small open-file limit
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    first = comm(store, rank, world, timeout_s=20)
    assert exchange(first, rank)
    socks = []
    if rank == 0:
        host, port = _tcp_address(store, 1)
        for _ in range(silent):  # connect and say nothing
            socks.append(socket.create_connection((host, port), timeout=5))
        time.sleep(1.0)  # the victim's acceptor sees them all
        store.set("flooded", "1")
    else:
        store.wait(["flooded"])
    # A second communicator (what new_group does) while the silent connections are still open.
    second = comm(dist.PrefixStore("second", store), rank, world, timeout_s=20, transport="tcp")
    ok = exchange(second, rank) and exchange(first, rank)
    store.set(f"done{rank}", "1")
    store.wait([f"done{1 - rank}"])
    for s in socks:
        s.close()
    second.close()
    first.close()
    return ok


def test_flood_of_silent_connections_does_not_starve_a_new_communicator():
    """400 silent connections to a rank whose open-file limit is 256: it still creates a new
    communicator and talks on both (today the accepted sockets use up its descriptors: EMFILE)."""
    assert run_ranks(_flooded, 2, 400, env={"DICOMM_TRANSPORT": "tcp"}, timeout=90) == [True, True]


def _garbage_flood(rank, world, store, n):
    log = tempfile.TemporaryFile()
    saved = os.dup(2)
    os.dup2(log.fileno(), 2)
    c = comm(store, rank, world, timeout_s=20, transport="tcp")
    if rank == 0:
        host, port = _tcp_address(store, 1)
        for _ in range(n):
            s = socket.create_connection((host, port), timeout=5)
            s.sendall(b"GET / HTTP/1.1\r\n\r\n" + bytes(64))
            s.close()
        store.set("sent", "1")
    else:
        store.wait(["sent"])
        deadline = time.monotonic() + 20
        while c.stats()["rejected_connections"] < n and time.monotonic() < deadline:
            time.sleep(0.05)
    rejected = c.stats()["rejected_connections"]
    close_pair(c, store, rank)
    os.dup2(saved, 2)
    log.seek(0)
    lines = [line for line in log.read().decode().splitlines() if "rejected" in line]
    return rejected, len(lines)


def test_rejected_connections_are_logged_at_a_bounded_rate():
    n = 200
    _, (rejected, lines) = run_ranks(_garbage_flood, 2, n, timeout=90)
    assert rejected == n
    assert 1 <= lines <= 10, f"{lines} log lines for {n} rejected connections"


MSG = 16 * 1024
COUNT = 20_000  # 312.5 MiB of eager messages nobody has asked for yet


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _send_flood(c, store, tag: int, then_tag: int | None = None) -> None:
    """COUNT messages of MSG bytes to rank 1 (message i filled with i % 16), then an 8 B message
    holding 7 on `then_tag` if given; says "sent" once all are posted and waits for them."""
    bufs = [np.full(MSG, i, np.uint8) for i in range(16)]
    reqs = [c.isend(ptr(bufs[i % 16]), MSG, 1, tag=tag) for i in range(COUNT)]
    last = np.array([7], np.int64)
    if then_tag is not None:
        reqs.append(c.isend(ptr(last), 8, 1, tag=then_tag))
    store.set("sent", "1")
    for r in reqs:
        r.wait()


def _unmatched_flood(rank, world, store):
    c = comm(store, rank, world, timeout_s=60)
    assert exchange(c, rank)
    if rank == 0:
        _send_flood(c, store, tag=9)
        out = None
    else:
        before = _rss_bytes()
        store.wait(["sent"])
        time.sleep(2.0)  # whatever the receiver would buffer, it has buffered by now
        grown = _rss_bytes() - before
        b = np.zeros(MSG, np.uint8)
        in_order = True
        for i in range(COUNT):  # every message still arrives, in order
            c.irecv(ptr(b), MSG, 0, tag=9).wait()
            in_order &= bool(b[0] == i % 16 and b[-1] == i % 16)
        out = (grown, in_order)
    close_pair(c, store, rank)
    return out


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_unmatched_eager_messages_are_bounded_by_flow_control(transport):
    """20,000 unmatched 16 KiB sends: the receiver grows by the senders' credit limit (32 MiB), not
    by the 312 MiB sent (once: ~316 MB), and then receives every message in order."""
    _, (grown, in_order) = run_ranks(_unmatched_flood, 2, env={"DICOMM_TRANSPORT": transport}, timeout=180)
    assert in_order
    assert grown < 96 << 20, f"the receiver grew by {grown / 2**20:.0f} MiB"


def _unmatched_self_flood(rank, world, store):
    c = comm(store, rank, world, timeout_s=60)
    bufs = [np.full(MSG, i, np.uint8) for i in range(16)]
    before = _rss_bytes()
    sends = [c.isend(ptr(bufs[i % 16]), MSG, rank, tag=9) for i in range(COUNT)]
    grown = _rss_bytes() - before
    b = np.zeros(MSG, np.uint8)
    in_order = True
    for i in range(COUNT):  # every message still arrives, in order
        c.irecv(ptr(b), MSG, rank, tag=9).wait()
        in_order &= bool(b[0] == i % 16 and b[-1] == i % 16)
    for s in sends:
        s.wait()
    c.close()
    return grown, in_order


def test_unmatched_sends_to_self_are_bounded_too():
    """The same 20,000 unmatched 16 KiB sends, to this rank itself: small ones are buffered (the
    send completes at once, as an eager send would) only up to the flow-control limit; later ones
    wait for their receive, referencing the sender's buffer. Before, every one was copied (the
    rank grew by ~313 MiB)."""
    (grown, in_order), = run_ranks(_unmatched_self_flood, 1, timeout=120)
    assert in_order
    assert grown < 96 << 20, f"the rank grew by {grown / 2**20:.0f} MiB"


_DESCRIPTOR_SWEEP = """
import datetime, fcntl, gc, json, os, resource
import torch.distributed as dist
import dicomm._C as C

store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=10))
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
def is_open(fd):
    try:
        fcntl.fcntl(fd, fcntl.F_GETFD)
        return True
    except OSError:
        return False
def open_fds():  # without opening one to look (listing /proc/self/fd would)
    return [fd for fd in range(4096) if is_open(fd)]
# Fill the holes below the highest open descriptor: then `spare` is exactly how many it may open.
fillers = [os.open("/dev/null", os.O_RDONLY) for fd in range(open_fds()[-1]) if not is_open(fd)]
rows = []
for spare in range(48):
    before = open_fds()
    # New descriptors take the lowest free numbers: with the limit just above the highest open one,
    # the communicator can open `spare` more, and then fails.
    resource.setrlimit(resource.RLIMIT_NOFILE, (before[-1] + 1 + spare, hard))
    try:
        c = C.Communicator(dist.PrefixStore(str(spare), store), 0, 1, 10.0, "auto")
        error = None
    except Exception as e:
        c, error = None, f"{type(e).__name__}: {e}"
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    if c is not None:
        c.close()
        del c
    gc.collect()
    rows.append({"spare": spare, "error": error, "leaked": sorted(set(open_fds()) - set(before))})
    if error is None:
        break
print(json.dumps(rows))
"""


def test_a_communicator_failing_at_each_descriptor_it_opens_leaks_none():
    """The open-file limit set so that creating a communicator fails at its first, second, ...
    descriptor (the poller's epoll and eventfd, the shm and tcp listeners) until it succeeds: after
    each failure, and after the successful one is closed, the process holds exactly the descriptors
    it held before (the poller once leaked its epoll descriptor when its eventfd failed)."""
    import json
    import subprocess
    import sys

    env = dict(os.environ, DICOMM_TRANSPORT="auto", DICOMM_LOG_LEVEL="error")
    p = subprocess.run([sys.executable, "-c", _DESCRIPTOR_SWEEP], capture_output=True, text=True, timeout=180, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = json.loads(p.stdout.strip().splitlines()[-1])
    failures = [r for r in rows if r["error"]]
    assert len(failures) >= 3 and rows[-1]["error"] is None, rows  # it failed part-way, then came up
    assert all(r["leaked"] == [] for r in rows), [r for r in rows if r["leaked"]]


def _flood_then_other_tag(rank, world, store):
    c = comm(store, rank, world, timeout_s=60)
    assert exchange(c, rank)
    if rank == 0:
        _send_flood(c, store, tag=1, then_tag=2)  # one more message after the flood, on another tag
        out = None
    else:
        store.wait(["sent"])
        before = _rss_bytes()
        small = np.zeros(1, np.int64)
        c.irecv(ptr(small), 8, 0, tag=2).wait()  # isend does not block: it must arrive first
        grown = _rss_bytes() - before
        b = np.zeros(MSG, np.uint8)
        in_order = True
        for i in range(COUNT):  # then every flooded message, in order, byte-exact
            c.irecv(ptr(b), MSG, 0, tag=1).wait()
            in_order &= bool((b == i % 16).all())
        out = (grown, int(small[0]), in_order)
    close_pair(c, store, rank)
    return out


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_receive_behind_an_unmatched_flood_does_not_read_the_flood_into_memory(transport):
    """20,000 unmatched 16 KiB sends on tag 1, then one on tag 2, which the receiver asks for
    first. Senders hold credits for the eager bytes the receiver has not matched: past them a send
    goes as an announcement only, its data following when a receive matches it, so reaching the
    tag-2 message costs the receiver headers, not the 312 MiB before it. Before, the posted tag-2
    receive lifted the hold on the connection and the receiver read the whole flood into memory
    (measured: +281 MiB over tcp, +283 MiB over shm)."""
    _, (grown, value, in_order) = run_ranks(_flood_then_other_tag, 2, env={"DICOMM_TRANSPORT": transport}, timeout=180)
    assert value == 7
    assert in_order
    assert grown < 96 << 20, f"the receiver grew by {grown / 2**20:.0f} MiB while it waited for tag 2"


BATCH = 32  # 16 KiB messages per batch: 512 KiB, half the 1 MiB limit of the tests below


def _lock_step(rank, world, store, batches):
    c = comm(store, rank, world, timeout_s=60)
    ack = np.zeros(1, np.int64)
    if rank == 0:  # batches of eager sends, each after the receiver said it took the last one
        bufs = [np.full(MSG, i % 251, np.uint8) for i in range(BATCH * batches)]
        for k in range(batches):
            sends = [c.isend(ptr(bufs[k * BATCH + i]), MSG, 1, tag=3) for i in range(BATCH)]
            c.irecv(ptr(ack), 8, 1, tag=4).wait()
            for s in sends:
                s.wait()
        out = c.stats()["sends_short_of_credit"]
    else:
        b = np.zeros(MSG, np.uint8)
        exact = True
        for k in range(batches):
            for i in range(BATCH):
                c.irecv(ptr(b), MSG, 0, tag=3).wait()
                exact &= bool((b == (k * BATCH + i) % 251).all())
            c.isend(ptr(ack), 8, 0, tag=4).wait()
        out = (exact, c.stats()["credit_notes_sent"])
    close_pair(c, store, rank)
    return out


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_credits_come_back_as_the_receiver_takes_messages(transport):
    """16 batches of 512 KiB of eager sends under a 1 MiB limit, each batch sent once the receiver
    has taken the one before: the receiver tells the sender what it took (ahead of its reply on the
    same connection), so the sender is never short of credit, although it sent 8 MiB eagerly. A
    sender that never got credit back would announce every send after the second batch."""
    short, (exact, notes) = run_ranks(_lock_step, 2, 16, env={"DICOMM_TRANSPORT": transport,
                                                              "DICOMM_UNEXPECTED_MB": "1"}, timeout=120)
    assert exact
    assert notes >= 16 * BATCH * MSG // (1 << 20) * 2, f"only {notes} credit notes for 8 MiB taken"
    assert short == 0, f"{short} sends found the receiver's room used up"


def _receiver_dies_behind_a_flood(rank, world, store):
    import os

    import dicomm._C as C

    c = comm(store, rank, world, timeout_s=60)
    assert exchange(c, rank)
    if rank == 1:
        store.wait(["sent"])
        os._exit(0)  # takes nothing, vanishes
    bufs = [np.full(MSG, i, np.uint8) for i in range(16)]
    reqs = [c.isend(ptr(bufs[i % 16]), MSG, 1, tag=1) for i in range(COUNT)]
    store.set("sent", "1")
    t0 = time.monotonic()
    failed = []
    for r in reqs:
        try:
            r.wait()
        except C.PeerError as e:
            failed.append(str(e))
    elapsed = time.monotonic() - t0
    short = c.stats()["sends_short_of_credit"]
    c.close()
    return len(failed), failed[-1] if failed else "", short, elapsed


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_receiver_dying_behind_a_flood_fails_the_announced_sends(transport):
    """The sends past the receiver's room wait as announcements for a receive that never comes:
    when the receiver dies they fail naming it, promptly (the timeout is 60 s)."""
    (failed, text, short, elapsed), _ = run_ranks(_receiver_dies_behind_a_flood, 2,
                                                  env={"DICOMM_TRANSPORT": transport}, expect_dead=[1], timeout=120)
    assert short > 0 and failed >= short, (failed, short)
    assert "rank 1 is gone" in text, text
    assert elapsed < 20
