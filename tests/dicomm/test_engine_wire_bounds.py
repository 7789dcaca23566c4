"""One peer never writes outside what the receiver posted, whatever it sends (issue 27, point 1).

A hostile client holding the handshake key (a same-uid process reading the job's store, with no
DICOMM_JOB_SECRET) claims rank 2, which never starts, writes rank 2's address card naming its own
pid (what such a process can do: the documented gap without a secret), announces a message for
rank 0's posted 16-byte receive, and once cleared to send sends a data frame whose offset + bytes
wraps around 2^64. The receive sits inside a larger array so that a write outside it is seen, not
merely a crash. Real communicators in real processes, real TCP sockets."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.dicomm.engine_util import comm, exchange, ptr
from tests.dicomm.multiproc import run_ranks

INTRUDER = Path(__file__).with_name("intruder.py")
TAG = 9
GUARD = 1 << 17  # bytes on each side of the receive buffer: more than any K below


def _wait_polling(store, key: str) -> None:
    # Not store.wait: a waiting TCPStore client holds its socket, and the engine reads the card
    # of the connection it holds through the same client meanwhile.
    while not store.check([key]):
        time.sleep(0.05)


def _intrude(store, args: list[str], src: int) -> dict:
    """Runs the intruder claiming rank `src` and, as it connects, writes rank src's card naming the
    intruder's pid (and no address): rank 0 holds the connection until that card is read."""
    proc = subprocess.Popen([sys.executable, str(INTRUDER), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    card = store.get("dicomm/card/0").decode().splitlines()
    card = [ln for ln in card if ln and not ln.startswith(("addr.", "pid="))]
    store.set(f"dicomm/card/{src}", "\n".join(card + [f"pid={proc.pid}"]) + "\n")
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def _forged_data_job(rank, world, store, k):
    import dicomm._C as C

    if rank == 2:  # takes no part: the intruder claims its place before it ever connects
        return None
    c = comm(store, rank, world, timeout_s=20, transport="tcp")
    out = {}
    if rank == 0:
        arena = np.full(2 * GUARD + 16, 0x5A, np.uint8)
        buf = arena[GUARD:GUARD + 16]
        buf[:] = 0
        r = c.irecv(ptr(buf), 16, 2, tag=TAG)
        store.set("posted", "1")
        _wait_polling(store, "attacked")
        try:
            r.wait()
            out["error"] = None
        except C.DicommError as e:
            out["error"] = f"{type(e).__name__}: {e}"
        outside = np.concatenate([arena[:GUARD], arena[GUARD + 16:]])
        out["outside_written"] = int(np.count_nonzero(outside != 0x5A))
        out["buffer"] = bytes(buf).hex()
        out["violations"] = c.stats().get("protocol_violations", 0)
    else:
        store.wait(["posted"])
        card = dict(line.split("=", 1) for line in store.get("dicomm/card/0").decode().splitlines() if line)
        token = store.get("dicomm/token").decode()
        args = ["tcp-data", card["addr.tcp"], token, "", "2", "0", str(TAG), str(k)]
        out["intruder"] = _intrude(store, args, 2)
        store.set("attacked", "1")
    out["after"] = exchange(c, rank)  # rank 0 and rank 1 still talk
    store.set(f"done{rank}", "1")
    store.wait([f"done{1 - rank}"])
    c.close()
    return out


@pytest.mark.parametrize("k", [16, 65536])
def test_forged_data_frame_never_writes_outside_the_receive(k):
    r0, r1, _ = run_ranks(_forged_data_job, 3, k, timeout=60)
    assert r1["intruder"]["accepted"] and r1["intruder"]["cleared"], r1["intruder"]
    assert r0["outside_written"] == 0, f"{r0['outside_written']} bytes around the receive buffer were overwritten"
    assert r0["buffer"] == "00" * 16, "the forged bytes landed in the receive"
    assert r0["error"] and r0["error"].startswith("PeerError") and "rank 2" in r0["error"], r0["error"]
    assert "outside the 16 B posted" in r0["error"], r0["error"]
    assert r0["violations"] == 1
    assert r1["intruder"]["closed"], "the forged connection was left open"
    assert r0["after"] and r1["after"], "ranks 0 and 1 stopped talking after the forged connection closed"


CASES = int(os.environ.get("DICOMM_WIRE_FUZZ_CASES", "3"))
SEED = int(os.environ.get("DICOMM_WIRE_FUZZ_SEED", "27"))
CAPACITY = 64


def _fuzzed_job(rank, world, store, seed):
    import dicomm._C as C

    if rank >= 2:  # absent: the intruder claims each of these ranks once
        return None
    c = comm(store, rank, world, timeout_s=20, transport="tcp")
    out = {"cases": []}
    if rank == 0:
        arenas, recvs = {}, {}
        for src in range(2, world):
            arenas[src] = np.full(2 * 256 + CAPACITY, 0x5A, np.uint8)
            recvs[src] = c.irecv(ptr(arenas[src][256:256 + CAPACITY]), CAPACITY, src, tag=TAG)
        store.set("posted", "1")
        _wait_polling(store, "attacked")
        for src in range(2, world):
            case = {"src": src, "sent": json.loads(store.get(f"sent{src}").decode())}
            try:
                recvs[src].wait()
                n = len(bytes.fromhex(case["sent"]["message"] or ""))
                case["got"] = bytes(arenas[src][256:256 + n]).hex()
            except C.DicommError as e:
                case["error"] = f"{type(e).__name__}: {e}"
            around = np.concatenate([arenas[src][:256], arenas[src][256 + CAPACITY:]])
            case["outside_written"] = int(np.count_nonzero(around != 0x5A))
            out["cases"].append(case)
        out["violations"] = c.stats()["protocol_violations"]
    else:
        store.wait(["posted"])
        card = dict(line.split("=", 1) for line in store.get("dicomm/card/0").decode().splitlines() if line)
        token = store.get("dicomm/token").decode()
        for src in range(2, world):
            args = ["tcp-fuzz", card["addr.tcp"], token, "", str(src), "0", str(TAG), str(seed + src)]
            store.set(f"sent{src}", json.dumps(_intrude(store, args, src)))
        store.set("attacked", "1")
    # Meanwhile and after, ranks 0 and 1 move real data: it must arrive exactly.
    for i in range(3):
        mine = np.random.default_rng(seed * 10 + rank * 3 + i).integers(0, 256, 100_000, dtype=np.uint8)
        theirs = np.zeros_like(mine)
        r = c.irecv(ptr(theirs), theirs.size, 1 - rank, tag=1)
        c.isend(ptr(mine), mine.size, 1 - rank, tag=1).wait()
        r.wait()
        want = np.random.default_rng(seed * 10 + (1 - rank) * 3 + i).integers(0, 256, 100_000, dtype=np.uint8)
        out.setdefault("exact", []).append(bool(np.array_equal(theirs, want)))
    store.set(f"done{rank}", "1")
    store.wait([f"done{1 - rank}"])
    c.close()
    return out


def test_fuzzed_frames_from_a_live_intruder_never_corrupt_the_job():
    """Structure-aware fuzzing of a live listener: for each of CASES absent ranks, an intruder
    with the store's token claims it, and sends frames drawn from a seed (tests/dicomm/intruder.py
    tcp-fuzz) at a posted 64-byte receive. Whatever it sends: nothing outside the receive is
    written; a receive that completes holds exactly the bytes announced; one that fails names the
    rank claimed; ranks 0 and 1 keep exchanging data exactly."""
    # Lazy connects: rank 0's connector would otherwise wait on the cards of the absent ranks, and
    # on the harness store while the test's own store.wait holds it.
    results = run_ranks(_fuzzed_job, 2 + CASES, SEED, timeout=120, env={"DICOMM_CONNECT": "lazy"})
    r0, r1 = results[0], results[1]
    assert all(r0["exact"]) and all(r1["exact"])
    for case in r0["cases"]:
        sent, src = case["sent"], case["src"]
        assert sent["accepted"], case
        assert case["outside_written"] == 0, case
        if "got" in case:
            assert case["got"] == sent["message"], case
        else:
            assert re.match(r"(PeerError|MismatchError)", case["error"]) and f"rank {src}" in case["error"], case
            assert sent["mutated"] or "65 B" in case["error"], f"a valid message was not delivered: {case}"
    assert r0["violations"] <= CASES
