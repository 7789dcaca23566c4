"""dicomm's engine on real verbs (run inside the Soft-RoCE guest by guest_session.sh).

Real processes on rxe0 with transport="verbs": point-to-point 0 B .. 64 MiB verified byte for byte,
every collective against numpy, the torch backend with DICOMM_TRANSPORT=verbs, latency and bandwidth
through the Communicator, a peer killed mid-transfer, a wrong DICOMM_IB_GID_INDEX, a peer of another
verbs wire version, and (on its own, last:
`guest_p2p port_down`) the port going down under waiting receives. Prints one
JSON line (one entry per scenario, each with "ok" or "error"); exit 0 only if all passed.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback

import numpy as np

from tests.dicomm.multiproc import run_ranks

SIZES = [0, 1, 8, 4095, 8192, 8193, 65536, 65537, 1 << 20, (3 << 20) + 7, 16 << 20, 64 << 20]


def _data(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=n, dtype=np.uint8)


def _comm(store, rank: int, world: int, timeout_s: float = 60.0):
    import dicomm._C as C

    return C.Communicator(store, rank, world, timeout_s, "verbs")


def _close(c) -> None:
    c.barrier().wait()
    time.sleep(0.2)  # the peer's last send may still be draining
    c.close()


def _p2p(rank: int, world: int, store, sizes: list[int], measure: bool) -> dict:
    """Each size from every rank to the next (a ring), checked; then collectives against numpy."""
    c = _comm(store, rank, world)
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    for i, n in enumerate(sizes):
        out, got = _data(n, 1000 * i + rank), np.full(n, 0xEE, np.uint8)
        r = c.irecv(got.ctypes.data, n, prv, i)
        c.isend(out.ctypes.data, n, nxt, i).wait()
        r.wait()
        del out
        want = _data(n, 1000 * i + prv)
        if not np.array_equal(got, want):
            raise AssertionError(f"{n} B from rank {prv}: {int((got != want).sum())} bytes differ")
        del got, want  # 64 MiB messages: keep the guest's memory for the next size
    res = {"paths": [c.transport_of(p) for p in range(world)], "sizes": len(sizes)}
    res["collectives"] = _collectives(c, rank, world)
    if measure and world == 2:
        res.update(_numbers(c, rank))
    res["stats"] = {k: v for k, v in c.stats().items() if k.startswith("verbs_")}
    _close(c)
    return res


def _collectives(c, rank: int, world: int) -> list[str]:
    """Every collective, each checked against what numpy computes from all ranks' inputs."""
    done = []

    def check(name: str, got: np.ndarray, want: np.ndarray) -> None:
        if not np.array_equal(got, want):
            differ = int((got != want).sum())
            raise AssertionError(f"{name} on rank {rank}: {differ} of {want.size} elements differ from numpy")
        done.append(name)

    def vec(r: int, n: int) -> np.ndarray:  # rank r's float64 input: integers, so sums are exact in any order
        return np.random.default_rng(500 + r).integers(-1000, 1000, size=n).astype(np.float64)

    n = 70001  # several chunks and an uneven split
    x = vec(rank, n)
    c.all_reduce(x.ctypes.data, n, "float64", "sum").wait()
    check("all_reduce", x, sum(vec(r, n) for r in range(world)))
    root = world - 1
    x = vec(rank, n)
    c.reduce(x.ctypes.data, n, "float64", "max", root).wait()
    check("reduce", x, np.maximum.reduce([vec(r, n) for r in range(world)]) if rank == root else vec(rank, n))
    mine, parts = _data(100003, rank), [np.zeros(100003, np.uint8) for _ in range(world)]
    c.all_gather(mine.ctypes.data, mine.size, [p.ctypes.data for p in parts]).wait()
    check("all_gather", np.concatenate(parts), np.concatenate([_data(100003, r) for r in range(world)]))
    parts = [np.zeros(65537, np.uint8) for _ in range(world)] if rank == 0 else []
    mine = _data(65537, 10 + rank)
    c.gather(mine.ctypes.data, mine.size, [p.ctypes.data for p in parts], 0).wait()
    if rank == 0:
        check("gather", np.concatenate(parts), np.concatenate([_data(65537, 10 + r) for r in range(world)]))
    else:
        done.append("gather")
    sroot = 1 % world
    src = [_data(40000, 20 + r) for r in range(world)] if rank == sroot else []
    got = np.zeros(40000, np.uint8)
    c.scatter([p.ctypes.data for p in src], got.ctypes.data, got.size, sroot).wait()
    check("scatter", got, _data(40000, 20 + rank))
    blocks = [vec(100 * rank + b, 30011) for b in range(world)]
    got = np.zeros(30011, np.float64)
    c.reduce_scatter([p.ctypes.data for p in blocks], got.ctypes.data, got.size, "float64", "sum").wait()
    check("reduce_scatter", got, sum(vec(100 * r + rank, 30011) for r in range(world)))

    def size(a: int, b: int) -> int:  # bytes from rank a to rank b: every pair its own size
        return 1000 * (a + 1) + 7 * b + 3

    send = [_data(size(rank, b), 1000 + 10 * rank + b) for b in range(world)]
    recv = [np.zeros(size(a, rank), np.uint8) for a in range(world)]
    c.all_to_all([p.ctypes.data for p in send], [p.size for p in send], [p.ctypes.data for p in recv],
                 [p.size for p in recv]).wait()
    check("all_to_all", np.concatenate(recv),
          np.concatenate([_data(size(a, rank), 1000 + 10 * a + rank) for a in range(world)]))
    b = _data(1 << 20, 77) if rank == 0 else np.zeros(1 << 20, np.uint8)
    c.broadcast(b.ctypes.data, b.size, 0).wait()
    check("broadcast", b, _data(1 << 20, 77))
    c.barrier().wait()
    done.append("barrier")
    return done


def _numbers(c, rank: int) -> dict:
    """8 B half round trip and 1 MiB streaming bandwidth through the Communicator."""
    peer, buf, tag = 1 - rank, np.zeros(1 << 20, np.uint8), 1 << 40
    ptr = buf.ctypes.data  # once: the attribute builds a ctypes object each time

    def pingpong(n: int, iters: int) -> list[float]:
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            if rank == 0:
                c.isend(ptr, n, peer, tag).wait()
                c.irecv(ptr, n, peer, tag).wait()
            else:
                c.irecv(ptr, n, peer, tag).wait()
                c.isend(ptr, n, peer, tag).wait()
            times.append((time.perf_counter() - t0) / 2 * 1e6)
        return times

    pingpong(8, 50)
    lat = pingpong(8, 500)
    count, t0 = 32, time.perf_counter()
    if rank == 0:
        for req in [c.isend(ptr, buf.size, peer, tag + 1) for _ in range(count)]:
            req.wait()
        c.irecv(ptr, 1, peer, tag + 2).wait()
    else:
        for _ in range(count):
            c.irecv(ptr, buf.size, peer, tag + 1).wait()
        c.isend(ptr, 1, peer, tag + 2).wait()
    bw = buf.size * count / (time.perf_counter() - t0) / (1 << 20)  # MiB/s, as perftest's "MB/sec"
    return {"lat_8B_us": round(float(np.median(lat)), 2), "lat_8B_mean_us": round(float(np.mean(lat)), 2),
            "bw_1MiB_MiBps": round(bw, 1)}


def _latency(rank: int, world: int, store) -> dict:
    c = _comm(store, rank, world)
    res = _numbers(c, rank)
    _close(c)
    return res


def _torch_backend(rank: int, world: int, store) -> dict:
    import torch
    import torch.distributed as dist

    dist.init_process_group("dicomm", store=store, rank=rank, world_size=world)
    try:
        t = torch.arange(300000, dtype=torch.float32) + rank
        if rank == 0:
            dist.send(t, 1)
        else:
            got = torch.empty_like(t)
            dist.recv(got, 0)
            assert torch.equal(got, torch.arange(300000, dtype=torch.float32)), "recv differs"
        s = torch.full((1000,), float(rank + 1))
        dist.all_reduce(s)
        assert torch.equal(s, torch.full((1000,), float(sum(range(1, world + 1))))), "all_reduce differs"
        path = dist.distributed_c10d._get_default_group().communicator.transport_of(1 - rank)
        dist.barrier()
        return {"path": path}
    finally:
        dist.destroy_process_group()


def _killed_peer(rank: int, world: int, store) -> dict:
    """Rank 0 is SIGKILLed while rank 1 RDMA-reads its 64 MiB message: rank 1 must get PeerError.
    Rank 1 kills it once the first bytes have landed (a fixed sleep let a fast guest move the whole
    message first); a receive that still completed must hold the whole message (see _killed_peer_tries)."""
    import os
    import signal

    import dicomm._C as C

    c = _comm(store, rank, world, timeout_s=30.0)
    n = 64 << 20
    if rank == 0:
        buf = _data(n, 5)
        store.set("pid0", str(os.getpid()))
        c.isend(buf.ctypes.data, n, 1, 9)
        time.sleep(120)  # until rank 1 kills it
        os._exit(3)
    got = np.full(n, 0xEE, np.uint8)
    head = _data(n, 5)[:64]
    r = c.irecv(got.ctypes.data, n, 0, 9)
    pid0 = int(store.get("pid0"))
    deadline = time.monotonic() + 60
    while not (got[:64] == head).any() and time.monotonic() < deadline:  # the first bytes have landed
        time.sleep(0.0005)
    os.kill(pid0, signal.SIGKILL)
    t0 = time.monotonic()
    try:
        r.wait(30.0)
        return {"completed": True, "whole": bool(np.array_equal(got, _data(n, 5)))}
    except C.PeerError as e:
        return {"kind": "PeerError", "seconds": round(time.monotonic() - t0, 2), "text": str(e)}
    except C.DicommError as e:
        return {"kind": type(e).__name__, "seconds": round(time.monotonic() - t0, 2), "text": str(e)}


KILLED_PEER_TRIES = 4


def _killed_peer_tries() -> dict:
    """_killed_peer until the kill lands mid-transfer, at most KILLED_PEER_TRIES times; the last
    outcome, with every try's."""
    tries = []
    for _ in range(KILLED_PEER_TRIES):
        res = run_ranks(_killed_peer, 2, timeout=90, expect_dead=[0])[1]
        tries.append(res)
        if not res.get("completed"):
            break
    return {**tries[-1], "tries": tries}


def _pingpongs(c, rank: int, n: int = 100) -> None:
    """8 B ping-pongs, past a half ring of receive slots both ways: credit writes in both send queues."""
    buf = np.zeros(8, np.uint8)
    for _ in range(n):
        if rank == 0:
            c.isend(buf.ctypes.data, 8, 1, 1).wait()
            c.irecv(buf.ctypes.data, 8, 1, 1).wait()
        else:
            c.irecv(buf.ctypes.data, 8, 0, 1).wait()
            c.isend(buf.ctypes.data, 8, 0, 1).wait()


# Below this share of the bytes written, a transfer was cut short (a whole one writes about 255/256:
# the pattern holds the 0xEE the buffer starts with once in 256 bytes).
MID_TRANSFER = 0.98


def _matched_receive_times_out(rank: int, world: int, store) -> dict:
    """A 128 MiB receive whose deadline passes while its RDMA reads are under way: after the
    TimeoutError its buffer must not change any more (snapshot, 4 s, compare: without withdrawing,
    the reads go on landing), the sender's send fails as timed out, and the next messages on the
    connection (rendezvous and eager) arrive intact. How fast the guest moves 128 MiB varies with the
    host, so deadlines are tried in turn (a message each) until one passes mid-transfer; every try
    is reported, with what changed after its TimeoutError."""
    import dicomm._C as C

    c = _comm(store, rank, world)
    n = 128 << 20
    deadlines = (0.5, 0.1, 0.02, 0.005)
    later = [_data((3 << 20) + 7, 81), _data(4000, 82)]
    if rank == 0:
        big = _data(n, 80)
        sends = []
        for i in range(len(deadlines)):
            req = c.isend(big.ctypes.data, n, 1, 90 + i)  # announced (kRts) when posted
            store.set(f"announced{i}", "1")
            try:
                req.wait(60.0)
                sends.append("completed")
            except C.DicommError as e:
                sends.append(f"{type(e).__name__}: {e}")
            store.wait([f"verdict{i}"])
            if store.get(f"verdict{i}") == b"done":
                break
        for i, m in enumerate(later):
            c.isend(m.ctypes.data, m.size, 1, 81 + i).wait(60.0)
        _close(c)
        return {"first_send": sends[-1], "sends": sends}
    tries = []
    result: dict = {}
    for i, deadline in enumerate(deadlines):
        got = np.full(n, 0xEE, np.uint8)
        r = c.irecv(got.ctypes.data, n, 0, 90 + i)
        store.wait([f"announced{i}"])
        t0 = time.monotonic()
        try:
            r.wait(deadline)
            tries.append({"deadline": deadline, "outcome": "completed before its deadline"})
            store.set(f"verdict{i}", "again")
            continue
        except C.TimeoutError as e:
            text, seconds = str(e), round(time.monotonic() - t0, 3)
        snapshot = got.copy()
        time.sleep(4.0)  # longer than the rest of the transfer would take
        changed = int(np.count_nonzero(got != snapshot))
        written = int(np.count_nonzero(snapshot != 0xEE))  # about 255/256 of the bytes that landed
        del snapshot
        mid_transfer = "never written again" in text and 0 < written < n * MID_TRANSFER
        result = {"text": text, "seconds": seconds, "changed_after": changed, "written_before": written,
                  "bytes": n, "deadline": deadline, "mid_transfer": mid_transfer}
        tries.append({"deadline": deadline, "outcome": "mid-transfer" if mid_transfer else text,
                      "written_before": written, "changed_after": changed})
        last = mid_transfer or i == len(deadlines) - 1
        store.set(f"verdict{i}", "done" if last else "again")
        if last:
            break
    next_ok = []
    for i, m in enumerate(later):
        buf = np.zeros(m.size, np.uint8)
        c.irecv(buf.ctypes.data, buf.size, 0, 81 + i).wait(60.0)
        next_ok.append(bool(np.array_equal(buf, m)))
    _close(c)
    return {**result, "tries": tries, "next_ok": next_ok}


def _close_and_drop(c) -> dict:
    """Seconds spent in close() and in dropping the communicator (its connections go with it)."""
    import gc

    t0 = time.monotonic()
    c.close()
    t1 = time.monotonic()
    del c
    gc.collect()
    return {"close_s": round(t1 - t0, 3), "drop_s": round(time.monotonic() - t1, 3)}


def _close_in_order(rank: int, world: int, store) -> dict:
    """Rank 0 sends its last (eager) message and closes at once; rank 1 takes the message only after
    that, then closes too. The message must arrive intact, and nothing may wait out the drain bound
    (DICOMM_IB_DRAIN_MS, 20 s here): not rank 1's receive (its engine tears down the connection the
    peer closed), not either close."""
    c = _comm(store, rank, world)
    _pingpongs(c, rank)
    last = _data(4000, 77)
    if rank == 0:
        c.isend(last.ctypes.data, last.size, 1, 2).wait()  # eager: complete once copied out
        res = _close_and_drop(c)
        store.set("closed0", "1")
        return res
    store.wait(["closed0"])
    got = np.zeros(last.size, np.uint8)
    t0 = time.monotonic()
    c.irecv(got.ctypes.data, got.size, 0, 2).wait()
    recv_s = round(time.monotonic() - t0, 3)
    return dict(_close_and_drop(c), recv_s=recv_s, last_message_ok=bool(np.array_equal(got, last)))


def _close_together(rank: int, world: int, store) -> dict:
    """Both ranks close at the same moment after a ping-pong: neither may wait out the drain bound."""
    c = _comm(store, rank, world)
    _pingpongs(c, rank)
    store.add("ready", 1)
    while store.add("ready", 0) < 2:
        time.sleep(0.001)
    return _close_and_drop(c)


def _reused_address(rank: int, world: int, store) -> dict:
    """Registration-cache staleness: each rank maps 4 MiB, transfers it (registered and cached),
    unmaps it, maps 4 MiB again (the kernel hands back the same address) with other bytes and
    transfers again. A cache that trusted the address would move the old, still pinned pages
    (address_reused: the send or the receive buffer came back at its old address)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype, libc.mmap.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                                              ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    n, peer = 4 << 20, 1 - rank

    def mapped() -> int:
        addr = libc.mmap(None, n, 3, 0x22, -1, 0)  # PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap failed")
        return addr

    c = _comm(store, rank, world)
    # Made first: no other large allocation may take the unmapped range before it is mapped again.
    mine = [_data(n, 300 + 10 * k + rank) for k in range(2)]
    theirs = [_data(n, 300 + 10 * k + peer) for k in range(2)]
    got = np.zeros(n, np.uint8)
    addrs, got_all = [], []
    for round_ in range(2):
        out, inn = mapped(), mapped()
        addrs.append((out, inn))
        ctypes.memmove(out, mine[round_].ctypes.data, n)
        r = c.irecv(inn, n, peer, 40 + round_)
        c.isend(out, n, peer, 40 + round_).wait()
        r.wait()
        ctypes.memmove(got.ctypes.data, inn, n)
        got_all.append(bool(np.array_equal(got, theirs[round_])))
        libc.munmap(out, n)
        libc.munmap(inn, n)
    stats = c.stats()
    _close(c)
    if not all(got_all):
        raise AssertionError(f"rounds byte-exact: {got_all} (addresses {addrs})")
    return {"address_reused": addrs[0][0] == addrs[1][0] or addrs[0][1] == addrs[1][1], "rounds_ok": got_all,
            "addrs": [[hex(a) for a in p] for p in addrs],
            "reg_cache": {k: v for k, v in stats.items() if k.startswith("verbs_reg")}}


def _middle_page(rank: int, world: int, store) -> dict:
    """A range remapped in part: each rank sends and receives a 4 MiB mapping (registered and cached),
    then maps a fresh page over one page in its middle (MAP_FIXED; first and last pages kept), writes
    new bytes over the whole range and transfers again at the same address and length. The cached
    registration still pins the replaced page: only a check of every page notices."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype, libc.mmap.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                                              ctypes.c_int, ctypes.c_int, ctypes.c_long]
    page = os.sysconf("SC_PAGE_SIZE")
    n, peer = 4 << 20, 1 - rank

    def mmap(addr, size, flags):
        got = libc.mmap(addr, size, 3, flags, -1, 0)  # PROT_READ|PROT_WRITE
        if got in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap failed")
        return got

    c = _comm(store, rank, world)
    out, inn = mmap(None, n, 0x22), mmap(None, n, 0x22)  # MAP_PRIVATE|MAP_ANONYMOUS
    got = np.zeros(n, np.uint8)
    ok, before = [], c.stats()
    for round_ in range(2):
        if round_:  # MAP_FIXED: a new page over the middle one of each buffer
            for base in (out, inn):
                mmap(base + n // 2, page, 0x22 | 0x10)
        mine, theirs = _data(n, 500 + 10 * round_ + rank), _data(n, 500 + 10 * round_ + peer)
        ctypes.memmove(out, mine.ctypes.data, n)
        r = c.irecv(inn, n, peer, 60 + round_)
        c.isend(out, n, peer, 60 + round_).wait()
        r.wait()
        ctypes.memmove(got.ctypes.data, inn, n)
        ok.append(bool(np.array_equal(got, theirs)))
    stale = c.stats().get("verbs_reg_cache_stale", 0) - before.get("verbs_reg_cache_stale", 0)
    _close(c)
    if not all(ok):
        bad = np.flatnonzero(got != _data(n, 510 + peer))
        raise AssertionError(f"rounds byte-exact: {ok}; {bad.size} bytes differ, from offset {bad[:1].tolist()}")
    return {"rounds_ok": ok, "stale_registrations": stale}


def _netdev_of(device: str = "rxe0", port: int = 1) -> str:
    """The network interface under a RoCE port (from its GID table's netdevs in sysfs)."""
    base = f"/sys/class/infiniband/{device}/ports/{port}/gid_attrs/ndevs"
    for name in sorted(os.listdir(base), key=int):
        try:
            with open(os.path.join(base, name)) as f:
                if netdev := f.read().strip():
                    return netdev
        except OSError:  # an empty GID table entry has no netdev
            continue
    raise AssertionError(f"no netdev under {device} port {port}")


def _port_down(rank: int, world: int, store) -> dict:
    """The network interface under rxe0 taken down while both ranks wait on a receive from each
    other: the port error (an asynchronous event of the device, not a completion) must fail both
    receives with PeerError well inside their 30 s, and a send to the lost peer must fail at once.
    Runs last in the guest session: the link comes back up, but connections on it are gone."""
    import subprocess

    import dicomm._C as C

    c = _comm(store, rank, world)
    _pingpongs(c, rank, 20)

    def barrier(key: str) -> None:  # through the store: it runs over loopback, not over the port
        store.add(key, 1)
        while store.add(key, 0) < world:
            time.sleep(0.01)

    buf = np.zeros(8, np.uint8)
    r = c.irecv(buf.ctypes.data, 8, 1 - rank, 5)  # never sent
    barrier("waiting")
    netdev = _netdev_of()
    if rank == 0:
        subprocess.run(["ip", "link", "set", netdev, "down"], check=True, timeout=30)
    res: dict = {"netdev": netdev}
    t0 = time.monotonic()
    try:
        r.wait(30.0)
        res["error"] = "the receive completed although nothing was sent"
    except C.DicommError as e:
        res.update(kind=type(e).__name__, seconds=round(time.monotonic() - t0, 2), text=str(e))
    t1 = time.monotonic()
    try:
        c.isend(buf.ctypes.data, 8, 1 - rank, 6).wait(30.0)
        res["send_after"] = "completed"
    except C.DicommError as e:
        res.update(send_after=type(e).__name__, send_after_s=round(time.monotonic() - t1, 2))
    barrier("seen")
    if rank == 0:
        subprocess.run(["ip", "link", "set", netdev, "up"], check=True, timeout=30)
    c.close()
    return res


def _bad_gid(rank: int, world: int, store) -> dict:
    import dicomm._C as C

    try:
        _comm(store, rank, world)
        return {"error": "DICOMM_IB_GID_INDEX=97 was accepted"}
    except C.DicommError as e:
        return {"kind": type(e).__name__, "text": str(e)}


def _wrong_wire_version(rank: int, world: int, store) -> dict:
    """A client that passes the handshake with the job's token, as a rank of another dicomm release
    would, and then sends verbs connection data of wire version 99 (WireInfo of
    transport/verbs/channel.h, laid out here from the header, not by dicomm): rank 0 must turn it
    away with a warning naming both versions, answer with its own magic and version (so that such a
    connector can name the mismatch too), hang up, and go on serving rank 1."""
    import socket
    import struct
    import tempfile

    from tests.dicomm import intruder

    c = _comm(store, rank, world)
    buf = np.zeros(8, np.uint8)
    if rank == 0:
        log = tempfile.TemporaryFile()
        saved = os.dup(2)
        os.dup2(log.fileno(), 2)  # the engine's warnings go to fd 2
        try:
            c.irecv(buf.ctypes.data, 8, 1, tag=1).wait()  # rank 1 sends this after its attempt
            rejected = c.stats()["rejected_connections"]
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        log.seek(0)
        warnings = [ln for ln in log.read().decode(errors="replace").splitlines() if "wire version" in ln]
        _close(c)
        return {"rejected": rejected, "warnings": warnings, "message_ok": bool((buf == 7).all())}
    card = dict(ln.split("=", 1) for ln in store.get("dicomm/card/0").decode().splitlines() if ln)
    host, port = card["addr.verbs"].split("/", 1)[0].rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=30)
    accepted = intruder.handshake(sock, bytes.fromhex(store.get("dicomm/token").decode()), b"", "verbs", 1, 0,
                                  challenge_wait_s=30)
    wire = struct.pack("<4I16s2IQ4I", 0x56434944, 0, 0, 0, bytes(16), 0, 0, 0, 0, 0, 99, 0)
    sock.settimeout(30)
    sock.sendall(wire)
    reply = intruder._recv_exact(sock, 64)
    magic, version = struct.unpack_from("<I", reply, 0)[0], struct.unpack_from("<I", reply, 56)[0]
    closed = intruder._closed(sock, within_s=30)
    sock.close()
    buf[:] = 7
    c.isend(buf.ctypes.data, 8, 0, tag=1).wait()
    _close(c)
    return {"accepted": accepted, "reply_magic": magic, "reply_version": version, "closed": closed}


def _eager_mismatch(rank: int, world: int, store) -> dict:
    """Rank 1 uses 4096 B eager messages (its communicator's setting), rank 0 the default 8192 B:
    rank 1's first send must fail with PeerError naming both sizes, and rank 0 must refuse the
    connection with a warning naming them."""
    import tempfile

    import dicomm._C as C

    settings = {"DICOMM_IB_EAGER_BYTES": "4096", "DICOMM_CONNECT": "lazy"} if rank == 1 else {"DICOMM_CONNECT": "lazy"}
    if rank == 0:
        log = tempfile.TemporaryFile()
        saved = os.dup(2)
        os.dup2(log.fileno(), 2)  # the engine's warnings go to fd 2
    try:
        c = C.Communicator(store, rank, world, 30.0, "verbs", settings)
        buf = np.zeros(8, np.uint8)
        if rank == 1:
            try:
                c.isend(buf.ctypes.data, 8, 0, 1).wait(30.0)
                res = {"send_kind": "completed", "send_error": ""}
            except C.DicommError as e:
                res = {"send_kind": type(e).__name__, "send_error": str(e)}
            store.set("tried", "1")
        else:
            store.wait(["tried"])
            deadline = time.monotonic() + 10
            while c.stats()["rejected_connections"] == 0 and time.monotonic() < deadline:
                time.sleep(0.05)
            res = {"rejected": c.stats()["rejected_connections"]}
        c.close()
    finally:
        if rank == 0:
            os.dup2(saved, 2)
            os.close(saved)
    if rank == 0:
        log.seek(0)
        res["warnings"] = [ln for ln in log.read().decode(errors="replace").splitlines() if "EAGER_BYTES" in ln]
    return res


def _settings_per_communicator(rank: int, world: int, store) -> dict:
    """Two verbs communicators alive at once in each process, one created with
    DICOMM_IB_EAGER_BYTES=0 as its own setting: its 4 KiB messages must go by rendezvous (registered,
    so its registration cache misses), the other's eagerly through the slots (no registration)."""
    import torch.distributed as dist

    import dicomm._C as C

    settings = {"eager_0": {"DICOMM_IB_EAGER_BYTES": "0"}, "default": {}}
    comms = {name: C.Communicator(dist.PrefixStore(name, store), rank, world, 60.0, "verbs", s)
             for name, s in settings.items()}
    misses, intact = {}, {}
    for name, c in comms.items():
        ok = True
        for i in range(3):
            want = _data(4096, i)
            buf = want.copy() if rank == 0 else np.zeros_like(want)
            if rank == 0:
                c.isend(buf.ctypes.data, buf.nbytes, 1, i).wait()
            else:
                c.irecv(buf.ctypes.data, buf.nbytes, 0, i).wait()
            ok &= bool(np.array_equal(buf, want))
        misses[name], intact[name] = c.stats()["verbs_reg_cache_misses"], ok
    for c in comms.values():
        _close(c)
    return {"misses": misses, "intact": intact}


def _gid_setting_per_communicator(rank: int, world: int, store) -> dict:
    """DICOMM_IB_GID_INDEX=97 as one communicator's setting fails that communicator, naming the
    setting and the GID table; a communicator made next without it comes up on verbs."""
    import torch.distributed as dist

    import dicomm._C as C

    try:
        C.Communicator(dist.PrefixStore("bad", store), rank, world, 30.0, "verbs", {"DICOMM_IB_GID_INDEX": "97"})
        text = "accepted"
    except C.DicommError as e:
        text = str(e)
    c = C.Communicator(dist.PrefixStore("good", store), rank, world, 30.0, "verbs")
    path_ok = c.stats()["verbs_peers"] == 0  # one rank: up, with no peer to serve
    c.close()
    return {"text": text, "other_ok": path_ok}


def _probe() -> dict:
    import dicomm._C as C

    return json.loads(C._verbs_probe())


def _probe_with_settings() -> dict:
    """The probe as a communicator given DICOMM_IB_GID_INDEX as its setting sees the ports."""
    import dicomm._C as C

    return {"gid_97": json.loads(C._verbs_probe({"DICOMM_IB_GID_INDEX": "97"}))["verbs"],
            "gid_0": json.loads(C._verbs_probe({"DICOMM_IB_GID_INDEX": "0"}))["verbs"]}


SCENARIOS = {
    "probe": _probe,
    "probe_settings": _probe_with_settings,
    "p2p_2": lambda: run_ranks(_p2p, 2, SIZES, True, timeout=240),
    "p2p_4": lambda: run_ranks(_p2p, 4, SIZES[:9], False, timeout=150),
    "p2p_3": lambda: run_ranks(_p2p, 3, SIZES[:6], False, timeout=120),  # an odd world: uneven splits
    # The earlier 100 us spin before sleeping on the completion channel: what the 1 ms verbs spin buys.
    "latency_spin_100us": lambda: run_ranks(_latency, 2, timeout=90, env={"DICOMM_IB_SPIN_US": "100"}),
    "torch_backend": lambda: run_ranks(_torch_backend, 2, timeout=90, env={"DICOMM_TRANSPORT": "verbs"}),
    "matched_timeout": lambda: run_ranks(_matched_receive_times_out, 2, timeout=120),
    "killed_peer": _killed_peer_tries,
    "close_in_order": lambda: run_ranks(_close_in_order, 2, timeout=120, env={"DICOMM_IB_DRAIN_MS": "20000"}),
    "close_together": lambda: run_ranks(_close_together, 2, timeout=120, env={"DICOMM_IB_DRAIN_MS": "20000"}),
    "reused_address": lambda: run_ranks(_reused_address, 2, timeout=90),
    "middle_page": lambda: run_ranks(_middle_page, 2, timeout=90),
    "bad_gid": lambda: run_ranks(_bad_gid, 1, timeout=30, env={"DICOMM_IB_GID_INDEX": "97"})[0],
    "wrong_wire_version": lambda: run_ranks(_wrong_wire_version, 2, timeout=120),
    "eager_mismatch": lambda: run_ranks(_eager_mismatch, 2, timeout=120),
    "settings_per_communicator": lambda: run_ranks(_settings_per_communicator, 2, timeout=120),
    "gid_setting": lambda: run_ranks(_gid_setting_per_communicator, 1, timeout=60)[0],
}
# Takes the port down: run on its own, at the end of a session (guest_session.sh).
LAST = {"port_down": lambda: run_ranks(_port_down, 2, timeout=120)}


def main() -> int:
    only = sys.argv[1:] or list(SCENARIOS)
    everything = {**SCENARIOS, **LAST}
    if unknown := [n for n in only if n not in everything]:
        print(f"unknown scenario(s) {unknown}; known: {sorted(everything)}", file=sys.stderr)
        return 2
    out = {}
    for name in only:
        t0 = time.monotonic()
        try:
            out[name] = {"ok": True, "result": everything[name]()}
        except BaseException:
            out[name] = {"ok": False, "error": traceback.format_exc()[-3000:]}
        out[name]["seconds"] = round(time.monotonic() - t0, 1)
        verdict = "ok" if out[name]["ok"] else "FAILED"
        print(f"{name}: {verdict} ({out[name]['seconds']} s)", file=sys.stderr, flush=True)
    print(json.dumps(out), flush=True)
    return 0 if all(v["ok"] for v in out.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
