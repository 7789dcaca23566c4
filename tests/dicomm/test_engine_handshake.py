"""Connections that are not from this job are closed and counted, and the job's traffic is
unaffected: real raw sockets (a garbage-speaking client, another job's token, a silent client)
against real communicators in real processes on one host."""
import pytest

from tests.dicomm.engine_util import comm, payload, ptr
from tests.dicomm.multiproc import run_ranks


def _hello(token: bytes, src: int, dst: int, transport: int) -> bytes:
    import struct

    # magic, version, transport, token, src, dst, stream, nstreams, reserved, extra[2]
    return struct.pack("<IHH16siiHHI2Q", 0x4D434944, 1, transport, token, src, dst, 0, 1, 0, 0, 0)


def _intruders(card: str):
    """Opens the hostile connections against the rank whose card is given; returns the sockets."""
    import os
    import socket

    addr = dict(line.split("=", 1) for line in card.splitlines() if line)
    host, port = addr["addr.tcp"].rsplit(":", 1)
    socks = []
    garbage = socket.create_connection((host, int(port)))
    garbage.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + os.urandom(64))
    wrong_token = socket.create_connection((host, int(port)))
    wrong_token.sendall(_hello(os.urandom(16), 0, 1, 1))
    silent = socket.create_connection((host, int(port)))
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.connect("\0" + addr["addr.shm"])
    unix.sendall(_hello(os.urandom(16), 0, 1, 2))
    socks += [garbage, wrong_token, silent, unix]
    return socks


def _job(rank, world, store, transport):
    import time

    import numpy as np

    c = comm(store, rank, world)
    out = {}
    if rank == 0:
        socks = _intruders(store.get("dicomm/card/1").decode())
        # Every intruder is hung up on: reading from it ends (EOF or reset), the silent one too.
        closed = 0
        for s in socks:
            s.settimeout(10)
            try:
                while s.recv(64):  # the listener's challenge may come first
                    pass
                closed += 1
            except ConnectionResetError:
                closed += 1
            except TimeoutError:
                pass
            s.close()
        out["closed"] = closed
        store.set("intruded", "1")
    else:
        store.wait(["intruded"])
    # The job's own traffic, both directions, after the intrusions.
    n = 1 << 20
    a, b = payload(n, rank), np.zeros(n, np.uint8)
    r = c.irecv(ptr(b), n, 1 - rank, tag=2)
    c.isend(ptr(a), n, 1 - rank, tag=2).wait()
    r.wait()
    out["intact"] = bool(np.array_equal(b, payload(n, 1 - rank)))
    deadline = time.monotonic() + 5
    while c.stats()["rejected_connections"] < 4 * rank and time.monotonic() < deadline:
        time.sleep(0.05)
    out["rejected"] = c.stats()["rejected_connections"]
    out["transport"] = c.transport_of(1 - rank)
    store.set(f"done{rank}", "1")
    store.wait([f"done{1 - rank}"])
    c.close()
    return out


# Short, so the silent client is hung up on soon; but it bounds the job's own handshakes too, and one
# of those stalled past it on a loaded host is refused (and counted) once before its retry succeeds.
HANDSHAKE_TIMEOUT_MS = 2000


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_garbage_wrong_token_and_silent_clients_are_rejected_and_counted(transport):
    r0, r1 = run_ranks(_job, 2, transport,
                       env={"DICOMM_TRANSPORT": transport, "DICOMM_HANDSHAKE_TIMEOUT_MS": str(HANDSHAKE_TIMEOUT_MS)})
    assert r0 == {"closed": 4, "intact": True, "rejected": 0, "transport": transport}
    assert r1 == {"intact": True, "rejected": 4, "transport": transport}
