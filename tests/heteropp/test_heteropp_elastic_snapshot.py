"""In-memory snapshots of elastic training (heteropp.engine.snapshot, snapshot_keeper): real keeper processes on
loopback (each, as on an emulated host, running a stand-in for the host's agent as its child), the state pieces
of one plan read back onto another plan's slices and compared with slicing the whole tensors directly, a
snapshot whole while one copy of every rank's state is left and not once both are gone, and every malformed
frame refused with its reason (a fuzzed parser, and a keeper that goes on serving after a bad frame)."""
from __future__ import annotations

import json
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from heteropp.engine.checkpoint import Slot
from heteropp.engine.snapshot import MemorySource, ask, choose, hosts_of, peer_of
from heteropp.engine.snapshot_keeper import (KEEPER_ENV, MAGIC, PREFIX, ProtocolError, Store, parse_header,
                                             parse_prefix, read_frame, write_frame)

from .long_tests import long_test

KEEPER = Path(__file__).resolve().parents[2] / "heteropp/engine/snapshot_keeper.py"


class Keeper:
    """A keeper process whose child (the agent's stand-in) writes down the address the keeper gave it."""

    def __init__(self, tmp: Path, name: str) -> None:
        where = tmp / f"{name}.addr"
        child = f"import os, time; open({str(where)!r}, 'w').write(os.environ[{KEEPER_ENV!r}]); time.sleep(600)"
        self.proc = subprocess.Popen([sys.executable, str(KEEPER), "--listen", "127.0.0.1:0", "--keep", "2", "--",
                                      sys.executable, "-c", child], start_new_session=True)
        deadline = time.time() + 30
        while not (where.exists() and where.read_text()):
            assert self.proc.poll() is None and time.time() < deadline, "the keeper did not start its child"
            time.sleep(0.02)
        self.addr = where.read_text()

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)  # the host: keeper and child
        self.proc.wait(timeout=30)


@pytest.fixture
def keepers(tmp_path, monkeypatch):
    monkeypatch.delenv("DICOMM_JOB_SECRET", raising=False)  # no job secret: the keepers' token is empty
    made: list[Keeper] = []
    yield lambda n: [made.append(Keeper(tmp_path, f"k{len(made)}")) or made[-1] for _ in range(n)]
    for k in made:
        if k.proc.poll() is None:
            k.kill()


# a model of three parameters: a column-split weight (dim 0), a row-split weight (dim 1), a norm (whole)
FULL = {"w1": (8, 4, 0), "w2": (4, 6, 1), "norm": (6, None, None)}
KINDS = ("master", "exp_avg", "exp_avg_sq")


def whole_tensors(seed: int) -> dict[tuple[str, str], torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = {}
    for key, (a, b, _) in FULL.items():
        for kind in KINDS:
            out[(key, kind)] = torch.randn((a, b) if b else (a,), generator=g)
    return out


def slots_of(tp_rank: int, tp: int) -> list[Slot]:
    """One rank's slots at TP `tp` (the norm written by TP rank 0 only, as heteropp's slots do)."""
    out = []
    for i, (key, (a, b, dim)) in enumerate(FULL.items()):
        full = (a, b) if b else (a,)
        if dim is None:
            shape, start = full, 0
        else:
            n = full[dim] // tp
            shape, start = tuple(n if d == dim else s for d, s in enumerate(full)), tp_rank * n
        writes = dim is not None or tp_rank == 0
        out.append(Slot(key, torch.nn.Parameter(torch.zeros(shape)), i, full, dim, start, writes))
    return out


def local(s: Slot, whole: torch.Tensor) -> torch.Tensor:
    return whole if s.dim is None else whole.narrow(s.dim, s.start, s.param.shape[s.dim])


def put(addr: str, rnd: str, step: int, rank: int, ranks: int, sl: list[Slot], whole: dict) -> None:
    pieces, blobs, off = [], [], 0
    for s in sl:
        if not s.writes:
            continue
        for kind in KINDS:
            t = local(s, whole[(s.key, kind)]).contiguous()
            pieces.append({"key": s.key, "kind": kind, "dtype": "float32", "shape": list(t.shape), "full": list(s.full),
                           "dim": s.dim, "start": s.start, "offset": off, "nbytes": t.numel() * 4})
            blobs.append(t.numpy().tobytes())
            off += t.numel() * 4
    meta = {"opt_step": step, "lr_schedule": {"lr": 0.003}} if rank == 0 else None
    ask(addr, {"op": "put", "round": rnd, "round_t": 1.0, "step": step, "rank": rank, "ranks": ranks, "meta": meta,
               "pieces": pieces}, b"".join(blobs))


def test_a_snapshot_of_one_plan_loads_onto_another_plans_slices(keepers) -> None:
    k0, k1 = keepers(2)
    whole = whole_tensors(0)
    for r in range(2):  # plan A: TP 2, rank r's state on its own host's keeper and the other's
        for k in (k0, k1):
            put(k.addr, "roundA", 6, r, 2, slots_of(r, 2), whole)
    snap = choose([k0.addr, k1.addr], newer_than=4)
    assert snap is not None and snap["step"] == 6 and snap["meta"]["opt_step"] == 6
    class Counted(MemorySource):  # the pieces a rank asks the keepers for
        fetched: list[int] = []

        def _fetch(self, rank, indices):  # type: ignore[no-untyped-def]
            self.fetched.extend(indices)
            return super()._fetch(rank, indices)

    for tp in (1, 4):  # plan B: each rank's slices of another TP size
        for r in range(tp):
            sl = slots_of(r, tp)
            state = {kind: [torch.full_like(s.param, float("nan")) for s in sl] for kind in KINDS}
            src = Counted(snap, sl)
            src.fetched = []
            meta = src.load(state)
            assert meta["step"] == 6
            # only what overlaps its slices: at TP 4 each split weight's quarter lies in one TP-2 half, the norm
            # is on rank 0 alone: 3 parameters x 3 kinds (fetching every rank's piece of a key would be 15)
            assert len(src.fetched) == (15 if tp == 1 else 9), (tp, r, src.fetched)
            for s in sl:
                for kind in KINDS:
                    assert torch.equal(state[kind][s.index], local(s, whole[(s.key, kind)])), (tp, r, s.key, kind)


def test_a_snapshot_is_whole_while_one_copy_of_each_rank_is_left_and_the_disk_is_taken_once_both_are_gone(
        keepers) -> None:
    hosts = keepers(3)
    addrs = [k.addr for k in hosts]
    assert hosts_of([addrs[0], addrs[0], addrs[1], None, addrs[2]]) == addrs
    whole = whole_tensors(1)
    for r, h in enumerate(addrs):  # rank r on host r: its own keeper and the next host's
        for addr in (h, peer_of(h, addrs)):
            put(addr, "roundA", 8, r, 3, slots_of(r, 1) if r == 0 else [], whole)
    assert choose(addrs, newer_than=8)["step"] == 8
    assert choose(addrs, newer_than=9) is None  # the disk checkpoint is newer
    hosts[1].kill()  # rank 1's copies: host 1 (gone) and host 2; rank 0's: host 0 and host 1 (gone)
    snap = choose(addrs, newer_than=0)
    assert snap is not None
    assert {r: sorted(w) for r, w in snap["where"].items()} == {"0": [addrs[0]], "1": [addrs[2]],
                                                                "2": sorted([addrs[2], addrs[0]])}
    hosts[2].kill()  # rank 1's second copy
    assert choose(addrs, newer_than=0) is None


def test_a_keeper_keeps_the_newest_snapshots_only() -> None:
    st = Store(keep=2, max_bytes=1 << 20)
    for step in (1, 2, 3):
        st.put({"round": "r", "round_t": 0.0, "step": step, "rank": 0, "ranks": 1, "meta": {}, "pieces": []},
               bytearray())
    assert [h["step"] for h in st.index()] == [2, 3]
    with pytest.raises(ProtocolError, match="exceed this keeper's 1048576"):
        st.put({"round": "r", "round_t": 0.0, "step": 4, "rank": 0, "ranks": 1, "meta": {}, "pieces": [
            {"key": "w", "kind": "master", "dtype": "float32", "shape": [1 << 19], "full": [1 << 19],
             "dim": None, "start": 0, "offset": 0, "nbytes": 1 << 21}]}, bytearray(1 << 21))


def _valid_put() -> bytes:
    t = torch.arange(6, dtype=torch.float32)
    h = json.dumps({"op": "put", "round": "r", "round_t": 0.0, "step": 2, "rank": 0, "ranks": 1, "meta": {},
                    "pieces": [{"key": "w", "kind": "master", "dtype": "float32", "shape": [2, 3], "full": [4, 3],
                                "dim": 0, "start": 2, "offset": 0, "nbytes": 24}]}).encode()
    return PREFIX.pack(MAGIC, len(h), 24) + h + t.numpy().tobytes()


def _parse(frame: bytes, store: Store) -> None:
    """What a keeper does with a frame's bytes, up to storing it."""
    hlen, plen = parse_prefix(frame[:PREFIX.size], store.max_bytes)
    body = frame[PREFIX.size:]
    if len(body) != hlen + plen:
        raise ProtocolError("short")  # a socket would wait for the rest; nothing is read past the lengths
    store.put(parse_header(body[:hlen]), bytearray(body[hlen:]))


def test_fuzzed_frames_are_refused_with_protocol_errors_only() -> None:
    rng = random.Random(0)
    good = _valid_put()
    _parse(good, Store(2, 1 << 20))
    refused = 0
    for i in range(4000):
        b = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            j = rng.randrange(len(b))
            b[j] = rng.randrange(256)
        if i % 5 == 0:  # and some lengths rewritten outright
            struct.pack_into(">IQ", b, 4, rng.choice([0, 1, len(b), 1 << 31]), rng.choice([0, 23, 25, 1 << 60]))
        try:
            _parse(bytes(b), Store(2, 1 << 20))
        except ProtocolError:
            refused += 1
    assert refused > 1000  # most mutations break something; none raised anything else


def _raw(addr: str, data: bytes) -> dict:
    """Send raw bytes after the keeper's hello; its first answer."""
    host, _, port = addr.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        assert "nonce" in read_frame(s, 0)[0]
        s.sendall(data)
        return read_frame(s, 1 << 20)[0]


def _frame(header: dict, payload_len: int = 0) -> bytes:
    h = json.dumps({"nonce": "n", "proof": "", **header}).encode()  # no secret: the proofs are empty
    return PREFIX.pack(MAGIC, len(h), payload_len) + h


def test_a_keeper_answers_a_bad_frame_with_its_reason_and_goes_on(keepers) -> None:
    (k,) = keepers(1)
    assert "bad magic" in _raw(k.addr, b"GET / HTTP/1.1\r\n\r\n")["error"]
    assert "header length 4294967295" in _raw(k.addr, PREFIX.pack(MAGIC, 2**32 - 1, 0))["error"]
    assert "exceeds the limit" in _raw(k.addr, PREFIX.pack(MAGIC, 2, 1 << 62))["error"]
    h = b'{"op": "put"'
    assert "not JSON" in _raw(k.addr, PREFIX.pack(MAGIC, len(h), 0) + h)["error"]
    put = {"op": "put", "round": "r", "round_t": 0, "step": 1, "rank": 0, "ranks": 1, "meta": None,
           "pieces": [{"key": "w", "kind": "master", "dtype": "float32", "shape": [4], "full": [4],
                       "dim": None, "start": 0, "offset": 8, "nbytes": 16}]}
    assert "outside a payload of 16" in _raw(k.addr, _frame(put, 16) + bytes(16))["error"]
    assert "wrong proof" in _raw(k.addr, _frame({"op": "index", "proof": "0" * 64}))["error"]
    reply, _ = ask(k.addr, {"op": "index"})  # still serving
    assert reply["snapshots"] == []
    host, _, port = k.addr.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        read_frame(s, 0)
        write_frame(s, {"op": "nothing", "nonce": "n", "proof": ""})
        assert "unknown op 'nothing'" in read_frame(s, 1 << 20)[0]["error"]


def test_keeper_and_rank_each_prove_the_job_key_before_any_state_moves(keepers, monkeypatch) -> None:
    """With a job secret, a rank proves the key (HMAC over both nonces) before the keeper reads a byte of its
    payload, and the keeper proves it back before a rank believes what it hands out. Before, a keeper read a
    whole frame (up to --max-bytes) before looking at a token sent in clear, and a rank trusted any listener."""
    monkeypatch.setenv("DICOMM_JOB_SECRET", "the job's secret")
    (k,) = keepers(1)
    assert ask(k.addr, {"op": "index"})[0]["snapshots"] == []  # the same secret: both proofs hold
    # another secret: refused before the 1 GiB payload the frame announces is read (none is ever sent)
    monkeypatch.setenv("DICOMM_JOB_SECRET", "another job's secret")
    with pytest.raises(RuntimeError, match="wrong proof"):
        ask(k.addr, {"op": "index"})
    host, _, port = k.addr.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        read_frame(s, 0)
        s.sendall(_frame({"op": "put", "proof": "0" * 64}, 1 << 30))
        assert "wrong proof" in read_frame(s, 1 << 20)[0]["error"]
    # a listener that does not know the key cannot pose as a keeper: its answer is not used
    monkeypatch.setenv("DICOMM_JOB_SECRET", "the job's secret")
    fake = socket.create_server(("127.0.0.1", 0))

    def pose() -> None:
        conn, _ = fake.accept()
        with conn:
            write_frame(conn, {"ok": True, "nonce": "abc"})
            read_frame(conn, 1 << 20)
            write_frame(conn, {"ok": True, "snapshots": [{"forged": True}], "proof": "f" * 64})

    t = threading.Thread(target=pose, daemon=True)
    t.start()
    with pytest.raises(RuntimeError, match="did not prove it holds this job's key"):
        ask(f"127.0.0.1:{fake.getsockname()[1]}", {"op": "index"})
    t.join(timeout=10)
    fake.close()


@long_test("1-2 min on 2 cores")
def test_a_round_resumes_from_the_disk_when_both_copies_of_a_stage_are_gone(tmp_path) -> None:
    """`heteropp run --elastic` over three emulated hosts (a `big` host of two processes, two `small` hosts of one,
    loopback, gloo), snapshots every step. Both `small` hosts die at once: in the ring of hosts one of them held
    the other's second copy, so that rank's state is in no keeper left and the round resumes from the newest
    disk checkpoint, as resuming it by hand does."""
    from .elastic_run import ElasticRun
    run = ElasticRun(tmp_path, steps=10, every=2, hosts="big:2,small:1,small:1", snapshot_every=1)
    run.wait_step(3)
    small = [h for h in run.events("host_started") if h["chip"] == "small"]
    killed = run.kill(small[0])
    run.kill(small[1])
    second = run.wait_round(killed)
    got = run.finish()
    assert second["chips"] == {"big": 2} and second["resume_source"] == "disk", second
    resumed = next(e for e in run.events("resumed") if e["time"] > second["time"])
    assert resumed["source"] == "disk" and resumed["step"] == second["resume_from"]
    run.check_by_hand(second, got)
