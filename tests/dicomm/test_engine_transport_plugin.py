"""A transport from outside the engine: the toy "pipe" transport (tests/dicomm/csrc/pipe_transport.cpp,
module `dicomm._C_toy_transport`) registers into `dicomm._C` at run time and carries messages between
real processes through the public API, with core/ naming it nowhere. Bytes are checked against payloads
each side regenerates on its own."""
import re
from pathlib import Path

import numpy as np
import pytest

from tests.dicomm.engine_util import close_pair, payload, ptr
from tests.dicomm.multiproc import run_ranks

SIZES = [0, 1, 8, 4095, 65537, 1 << 20]
CORE = Path(__file__).resolve().parents[2] / "dicomm" / "csrc" / "core"


def _register():
    import dicomm._C as C
    import dicomm._C_toy_transport as toy

    C._register_transport(toy.factory())
    return C


def _exchange(rank, world, store, transport):
    C = _register()
    c = C.Communicator(store, rank, world, 30.0, transport)
    peer = 1 - rank
    ok = []
    for i, n in enumerate(SIZES):
        got = np.zeros(max(n, 1), np.uint8)
        r = c.irecv(ptr(got), n, peer, tag=i)
        mine = payload(n, 100 * rank + i)
        c.isend(ptr(mine), n, peer, tag=i).wait()
        r.wait()
        ok.append(r.nbytes == n and bool(np.array_equal(got[:n], payload(n, 100 * peer + i))))
    path, stats = c.transport_of(peer), c.stats()
    close_pair(c, store, rank)
    return ok, path, stats["messages_sent"], stats["messages_received"]


def test_a_registered_toy_transport_carries_messages_through_the_public_api():
    for ok, path, sent, received in run_ranks(_exchange, 2, "pipe"):
        assert all(ok), f"sizes whose bytes differ: {[n for n, good in zip(SIZES, ok) if not good]}"
        assert path == "pipe"
        assert (sent, received) == (len(SIZES), len(SIZES))


def test_auto_keeps_the_preferred_transport_when_a_toy_one_is_registered():
    """The toy transport states a preference below every built-in one: auto still picks shared memory."""
    for ok, path, _, _ in run_ranks(_exchange, 2, "auto"):
        assert all(ok) and path == "shm"


def _twice(rank, world, store):
    C = _register()
    try:
        _register()
    except C.ValueError as e:
        return str(e)
    return None


def test_registering_a_name_twice_is_refused_by_name():
    (err,) = run_ranks(_twice, 1)
    assert err is not None and "'pipe' is registered already" in err


def test_an_unknown_transport_name_lists_the_registered_ones():
    import datetime

    import torch.distributed as dist

    import dicomm._C as C

    store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=10))
    with pytest.raises(C.ValueError, match=r"transport 'carrier-pigeon' is not known; expected auto, shm or tcp"):
        C.Communicator(store, 0, 1, 5.0, "carrier-pigeon")


def test_core_names_no_transport():
    """core/ reaches transports only through the interface: no transport's name or class in its code."""
    offenders = []
    for f in sorted(CORE.glob("*.[ch]*")):
        code = re.sub(r"//.*", "", f.read_text())  # comments may mention them
        for word in ('"shm"', '"tcp"', '"verbs"', "transport/shm/", "transport/tcp/", "transport/verbs/", "verbs::"):
            if word in code:
                offenders.append(f"{f.name}: {word}")
    assert offenders == []
