"""Ranks that disagree on a rooted collective's root or size all fail with MismatchError, the root
included, instead of "succeeding" with different data and leaving a stray message queued. Real
processes on one host (shared memory), each rank on a fresh communicator per case."""
from __future__ import annotations

import datetime

import numpy as np
import pytest

from tests.dicomm.collectives_util import open_comm
from tests.dicomm.engine_util import ptr
from tests.dicomm.multiproc import run_ranks

N = 256


def _call(c, kind: str, root: int, nbytes: int, rank: int, world: int):
    buf = np.full(nbytes, rank + 1, np.uint8)
    if kind == "broadcast":
        return c.broadcast(ptr(buf), nbytes, root), buf
    if kind == "reduce":
        return c.reduce(ptr(buf), nbytes, "uint8", "sum", root), buf
    if kind == "gather":
        out = np.zeros((world, nbytes), np.uint8)
        recv = [ptr(out) + r * nbytes for r in range(world)] if rank == root else []
        return c.gather(ptr(buf), nbytes, recv, root), (buf, out)
    if kind == "scatter":
        src = np.full((world, nbytes), 9, np.uint8)
        send = [ptr(src) + r * nbytes for r in range(world)] if rank == root else []
        return c.scatter(send, ptr(buf), nbytes, root), (buf, src)
    raise AssertionError(kind)


def _close_when_all_answered(c, store, name: str, rank: int, world: int) -> None:
    """Close only once every rank has its answer (through the store: the communicator has aborted): a
    closed peer is a different failure (PeerError)."""
    store.set(f"{name}-done{rank}", "1")
    store.wait([f"{name}-done{r}" for r in range(world)])
    c.close()


def _outcome(req) -> tuple[str, str]:
    """("ok", "") or the error's class name and text."""
    import dicomm._C as C

    try:
        req.wait()
        return ("ok", "")
    except C.DicommError as e:
        return (type(e).__name__, str(e))


def _disagree(rank, world, store, kind, roots, sizes):

    name = f"{kind}-{roots}-{sizes}"
    c = open_comm(rank, world, store, timeout_s=5.0, name=name)
    c.barrier().wait()  # every connection up
    # Then start together through the store: a mismatch aborts the communicator, and the abort
    # fails whatever is still pending, a slow rank's barrier included.
    store.set(f"{name}-ready{rank}", "1")
    store.wait([f"{name}-ready{r}" for r in range(world)])
    req, keep = _call(c, kind, roots[rank], sizes[rank], rank, world)
    out = _outcome(req)
    queued = c.stats()["unexpected_queued"]
    _close_when_all_answered(c, store, name, rank, world)
    return out + (queued,)


@pytest.mark.parametrize("kind", ["broadcast", "scatter", "reduce", "gather"])
def test_ranks_that_disagree_on_the_root_all_get_mismatch_error(kind):
    roots = [0, 0, 2]  # rank 2 believes it is the root
    results = run_ranks(_disagree, 3, kind, roots, [N] * 3)
    for rank, (name, text, queued) in enumerate(results):
        assert name == "MismatchError", (rank, name, text)
        assert "root 0" in text and "root 2" in text, (rank, text)
        assert queued == 0, f"rank {rank}: {queued} stray messages left queued"


def test_broadcast_size_mismatch_fails_the_root_too():
    results = run_ranks(_disagree, 2, "broadcast", [0, 0], [N, 2 * N])
    for rank, (name, text, queued) in enumerate(results):
        assert name == "MismatchError", (rank, name, text)
        assert queued == 0, f"rank {rank}: {queued} stray messages left queued"
        assert f"broadcast({N} B, root 0)" in text and f"broadcast({2 * N} B, root 0)" in text, (rank, text)


def _disagree_at_once(rank, world, store, rounds):
    """Every kind of rooted collective, `rounds` times each, as the first operation of a fresh
    communicator: no barrier first, so connections are still being set up when the aborting rank
    tells the others."""

    out = []
    for i in range(rounds):
        for kind in ("broadcast", "scatter", "reduce", "gather"):
            name = f"fresh-{kind}-{i}"
            c = open_comm(rank, world, store, timeout_s=10.0, name=name)
            req, keep = _call(c, kind, [0, 0, 2][rank], N, rank, world)
            out.append((kind, i) + _outcome(req))
            _close_when_all_answered(c, store, name, rank, world)
    return out


def test_a_root_mismatch_as_a_fresh_communicators_first_operation_is_a_mismatch_on_every_rank():
    # The race: the aborting rank's connections closed before its notice was read (or before the
    # peer had accepted them), and a peer reported "rank 0 is gone" instead of the mismatch.
    results = run_ranks(_disagree_at_once, 3, 3, timeout=240)
    wrong = [(rank, kind, i, name, text) for rank, rows in enumerate(results)
             for kind, i, name, text in rows if name != "MismatchError"]
    assert not wrong, "\n".join(map(str, wrong))


def _disagree_before_a_late_rank(rank, world, store, rounds):
    """Rank 1 names another root, and rank 0 fails on its signature before rank 2 creates its
    communicator: rank 0 cannot tell rank 2 at the abort (no card, no connection), so its connector
    reaches rank 2 only after the abort."""
    import torch.distributed as dist

    # The harness's own barrier on a client of its own: a wait on the communicator's client would hold
    # that client, which the connector reads rank 2's card through.
    side = dist.TCPStore(store.host, store.port, is_master=False, timeout=datetime.timedelta(seconds=60))
    out = []
    for i in range(rounds):
        if rank == 2:
            side.wait([f"late{i}-failed0"])
        c = open_comm(rank, world, store, timeout_s=10.0, name=f"late{i}")
        req, keep = _call(c, "broadcast", [0, 2, 0][rank], N, rank, world)
        out.append(_outcome(req))
        if rank == 0:
            side.set(f"late{i}-failed0", "1")
        _close_when_all_answered(c, side, f"late{i}", rank, world)
    return out


def test_a_rank_that_comes_late_to_an_aborted_communicator_gets_the_mismatch():
    # The late rank got "rank 0 is gone": the connection rank 0's connector opened after the abort was
    # closed at once, without the notice.
    results = run_ranks(_disagree_before_a_late_rank, 3, 2, timeout=120)
    for rank, rows in enumerate(results):
        for name, text in rows:
            assert name == "MismatchError", (rank, name, text)
            assert "root 0" in text and "root 2" in text, (rank, text)
