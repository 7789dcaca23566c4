"""Randomised point-to-point traffic across 4 real processes on one host: random sizes (eager and
rendezvous), random tags, specific and any-source receives, every byte checked against a
payload the receiver regenerates independently. Shared memory, and TCP over loopback standing in
for a network."""
import pytest

from tests.dicomm.engine_util import comm, payload, ptr
from tests.dicomm.multiproc import run_ranks

ROUNDS = 6
PER_ROUND = 12
MAX_SIZE = 3 << 20


def _plan(world: int, rnd: int):
    """Every rank derives the same plan: (src, dst, tag, size, seed) messages for a round."""
    import numpy as np

    rng = np.random.default_rng(1000 + rnd)
    msgs = []
    for i in range(PER_ROUND * world):
        src, dst = rng.choice(world, 2, replace=False)
        size = int(rng.choice([0, 1, 100, 16384, 20000, 65536, 70000, 1 << 20, MAX_SIZE]))
        # Tags differ per round: a fast rank's next round must not feed this round's any-source.
        msgs.append((int(src), int(dst), 10 * rnd + int(rng.integers(0, 3)), size, rnd * 100_000 + i))
    return msgs


def _soak(rank, world, store):
    import numpy as np

    c = comm(store, rank, world, timeout_s=60)
    bad = 0
    received = 0
    for rnd in range(ROUNDS):
        msgs = _plan(world, rnd)
        mine_in = [m for m in msgs if m[1] == rank]
        outgoing = [(m, payload(m[3], m[4])) for m in msgs if m[0] == rank]
        sends = [c.isend(ptr(a), a.nbytes, m[1], tag=m[2]) for m, a in outgoing]
        any_source = rnd % 2 == 1
        # Messages of one (src, tag) arrive in send order; receives are posted in plan order.
        recvs = []
        for m in mine_in:
            # Larger than needed (nbytes must say the truth); any-source may take any sender's.
            b = np.zeros((MAX_SIZE if any_source else m[3]) + 5, np.uint8)
            recvs.append((m, b, c.irecv(ptr(b), b.nbytes, -1 if any_source else m[0], tag=m[2])))
        by_key = {}
        for m in mine_in:
            by_key.setdefault((m[0], m[2]), []).append(m)
        for m, b, r in recvs:
            r.wait()
            received += 1
            if any_source:
                # The source is whoever matched; its next unmatched message of that tag is the one.
                expect = by_key[(r.source, m[2])].pop(0)
            else:
                expect = m
            n = expect[3]
            if r.nbytes != n or not np.array_equal(b[:n], payload(n, expect[4])):
                bad += 1
        for s in sends:
            s.wait()
    store.set(f"done{rank}", "1")
    store.wait([f"done{p}" for p in range(world)])
    c.close()
    return bad, received


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_random_traffic_across_four_ranks_is_byte_exact(transport):
    results = run_ranks(_soak, 4, env={"DICOMM_TRANSPORT": transport}, timeout=120)
    expected = [sum(1 for rnd in range(ROUNDS) for m in _plan(4, rnd) if m[1] == r) for r in range(4)]
    assert [bad for bad, _ in results] == [0] * 4
    assert [n for _, n in results] == expected
