"""dicomm's engine on real verbs (run inside the Soft-RoCE guest by guest_session.sh).

Real processes on rxe0 with transport="verbs": point-to-point 0 B .. 16 MiB verified byte for byte,
collectives against numpy, the torch backend with DICOMM_TRANSPORT=verbs, latency and bandwidth
through the Communicator, a peer killed mid-transfer, and a wrong DICOMM_IB_GID_INDEX. Prints one
JSON line (one entry per scenario, each with "ok" or "error"); exit 0 only if all passed.
"""
from __future__ import annotations

import json
import sys
import time
import traceback

import numpy as np

from tests.dicomm.multiproc import run_ranks

SIZES = [0, 1, 8, 4095, 8192, 8193, 65536, 65537, 1 << 20, (3 << 20) + 7, 16 << 20]


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
        if not np.array_equal(got, _data(n, 1000 * i + prv)):
            raise AssertionError(f"{n} B from rank {prv}: {int((got != _data(n, 1000 * i + prv)).sum())} bytes differ")
    res = {"paths": [c.transport_of(p) for p in range(world)], "sizes": len(sizes)}
    # Collectives: all_reduce (sum of float64), all_gather, broadcast; references from numpy.
    x = np.arange(4097, dtype=np.float64) * (rank + 1)
    c.all_reduce(x.ctypes.data, x.size, "float64", "sum").wait()
    if not np.array_equal(x, np.arange(4097, dtype=np.float64) * sum(range(1, world + 1))):
        raise AssertionError("all_reduce differs from numpy")
    mine, parts = _data(100003, rank), [np.zeros(100003, np.uint8) for _ in range(world)]
    c.all_gather(mine.ctypes.data, mine.size, [p.ctypes.data for p in parts]).wait()
    if not all(np.array_equal(parts[r], _data(100003, r)) for r in range(world)):
        raise AssertionError("all_gather differs")
    b = _data(1 << 20, 77) if rank == 0 else np.zeros(1 << 20, np.uint8)
    c.broadcast(b.ctypes.data, b.size, 0).wait()
    if not np.array_equal(b, _data(1 << 20, 77)):
        raise AssertionError("broadcast differs")
    if measure and world == 2:
        res.update(_numbers(c, rank))
    res["stats"] = {k: v for k, v in c.stats().items() if k.startswith("verbs_")}
    _close(c)
    return res


def _numbers(c, rank: int) -> dict:
    """8 B half round trip and 1 MiB streaming bandwidth through the Communicator."""
    peer, buf, tag = 1 - rank, np.zeros(1 << 20, np.uint8), 1 << 40
    ptr = buf.ctypes.data  # once: the attribute builds a ctypes object each time

    def pingpong(n: int, iters: int) -> float:
        t0 = time.perf_counter()
        for _ in range(iters):
            if rank == 0:
                c.isend(ptr, n, peer, tag).wait()
                c.irecv(ptr, n, peer, tag).wait()
            else:
                c.irecv(ptr, n, peer, tag).wait()
                c.isend(ptr, n, peer, tag).wait()
        return (time.perf_counter() - t0) / iters / 2 * 1e6

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
    bw = buf.size * count / (time.perf_counter() - t0) / 1e6
    return {"lat_8B_us": round(lat, 2), "bw_1MiB_MBps": round(bw, 1)}


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
    """Rank 0 dies (SIGKILL) while rank 1 RDMA-reads its 64 MiB message: rank 1 must get PeerError."""
    import os
    import signal

    import dicomm._C as C

    c = _comm(store, rank, world, timeout_s=30.0)
    n = 64 << 20
    if rank == 0:
        buf = _data(n, 5)
        c.isend(buf.ctypes.data, n, 1, 9)
        store.wait(["posted"])
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGKILL)
    got = np.zeros(n, np.uint8)
    r = c.irecv(got.ctypes.data, n, 0, 9)
    store.set("posted", "1")
    t0 = time.monotonic()
    try:
        r.wait(30.0)
        return {"error": "the receive completed although its sender died"}
    except C.PeerError as e:
        return {"kind": "PeerError", "seconds": round(time.monotonic() - t0, 2), "text": str(e)}
    except C.DicommError as e:
        return {"kind": type(e).__name__, "seconds": round(time.monotonic() - t0, 2), "text": str(e)}


def _bad_gid(rank: int, world: int, store) -> dict:
    import dicomm._C as C

    try:
        _comm(store, rank, world)
        return {"error": "DICOMM_IB_GID_INDEX=97 was accepted"}
    except C.DicommError as e:
        return {"kind": type(e).__name__, "text": str(e)}


def _probe() -> dict:
    import dicomm._C as C

    return json.loads(C._verbs_probe())


SCENARIOS = {
    "probe": _probe,
    "p2p_2": lambda: run_ranks(_p2p, 2, SIZES, True, timeout=150),
    "p2p_4": lambda: run_ranks(_p2p, 4, SIZES[:9], False, timeout=150),
    # Waits that spin longer instead of sleeping in epoll: how much of the latency is wake-ups.
    "latency_spin_5ms": lambda: run_ranks(_latency, 2, timeout=90, env={"DICOMM_SPIN_US": "5000"}),
    "torch_backend": lambda: run_ranks(_torch_backend, 2, timeout=90, env={"DICOMM_TRANSPORT": "verbs"}),
    "killed_peer": lambda: run_ranks(_killed_peer, 2, timeout=60, expect_dead=[0])[1],
    "bad_gid": lambda: run_ranks(_bad_gid, 1, timeout=30, env={"DICOMM_IB_GID_INDEX": "97"})[0],
}


def main() -> int:
    only = sys.argv[1:] or list(SCENARIOS)
    out = {}
    for name in only:
        t0 = time.monotonic()
        try:
            out[name] = {"ok": True, "result": SCENARIOS[name]()}
        except BaseException:
            out[name] = {"ok": False, "error": traceback.format_exc()[-3000:]}
        out[name]["seconds"] = round(time.monotonic() - t0, 1)
        print(f"{name}: {'ok' if out[name]['ok'] else 'FAILED'} ({out[name]['seconds']} s)", file=sys.stderr, flush=True)
    print(json.dumps(out), flush=True)
    return 0 if all(v["ok"] for v in out.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
