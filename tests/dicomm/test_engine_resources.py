"""Bounded resources: a flood of silent connections does not use up a rank's descriptors (a new
communicator still comes up under a 256-file limit), rejections are logged at a bounded rate, and
unmatched eager messages are held back by flow control instead of growing the receiver without
bound. Real processes on one host, real TCP and Unix sockets."""
from __future__ import annotations

import os
import resource
import socket
import tempfile
import time

import numpy as np

from tests.dicomm.engine_util import comm, exchange, ptr
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
    store.set(f"done{rank}", "1")
    store.wait([f"done{1 - rank}"])
    c.close()
    os.dup2(saved, 2)
    log.seek(0)
    lines = [line for line in log.read().decode().splitlines() if "rejected" in line]
    return rejected, len(lines)


def test_rejected_connections_are_logged_at_a_bounded_rate():
    n = 200
    _, (rejected, lines) = run_ranks(_garbage_flood, 2, n, timeout=90)
    assert rejected == n
    assert 1 <= lines <= 10, f"{lines} log lines for {n} rejected connections"
