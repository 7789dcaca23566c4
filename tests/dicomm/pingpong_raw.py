"""Raw-API ping-pong between two processes on this host (not a test; prints numbers).

    .venv/bin/python -m tests.dicomm.pingpong_raw [--transport shm|tcp] [--iters N]

Half round-trip latency (median, p99) and bandwidth (bytes / half round-trip) per size.
"""
from __future__ import annotations

import argparse
import json


def _pingpong(rank, world, store, sizes, iters):
    import time

    import numpy as np

    from tests.dicomm.engine_util import comm, ptr

    c = comm(store, rank, world, timeout_s=120)
    peer = 1 - rank
    out = []
    for n in sizes:
        buf = np.ones(max(n, 1), np.uint8)
        p = ptr(buf)
        reps = iters if n <= 65536 else max(5, min(iters, (256 << 20) // n))
        times = []
        for _ in range(reps + max(3, reps // 10)):  # the first rounds warm up
            t0 = time.perf_counter()
            if rank == 0:
                c.isend(p, n, peer, 0).wait()
                c.irecv(p, n, peer, 0).wait()
            else:
                c.irecv(p, n, peer, 0).wait()
                c.isend(p, n, peer, 0).wait()
            times.append(time.perf_counter() - t0)
        half = sorted(t / 2 for t in times[-reps:])
        med = half[len(half) // 2]
        out.append({"bytes": n, "lat_us_median": med * 1e6, "lat_us_p99": half[int(len(half) * 0.99) - 1] * 1e6,
                    "gbps": n / med / 1e9, "transport": c.transport_of(peer)})
    c.close()
    return out


def main() -> None:
    from tests.dicomm.multiproc import run_ranks

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--transport", default="auto", choices=["auto", "shm", "tcp"])
    ap.add_argument("--iters", type=int, default=20000)
    ap.add_argument("--sizes", default="8,4096,65536,1048576,67108864")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = run_ranks(_pingpong, 2, sizes, args.iters, env={"DICOMM_TRANSPORT": args.transport}, timeout=600)[0]
    if args.json:
        print(json.dumps(rows))
        return
    print(f"{'bytes':>10} {'transport':>9} {'lat med us':>11} {'lat p99 us':>11} {'GB/s':>8}")
    for r in rows:
        print(f"{r['bytes']:>10} {r['transport']:>9} {r['lat_us_median']:>11.2f} "
              f"{r['lat_us_p99']:>11.2f} {r['gbps']:>8.3f}")


if __name__ == "__main__":
    main()
