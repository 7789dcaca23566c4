"""Streaming bandwidth through the Communicator over verbs, measured as ib_write_bw measures it (run
in the Soft-RoCE guest by bench_session.sh):

    python -m tests.rdma.guest_stream OUT.json [--bytes 1048576] [--window 16] [--iters 12]

Two ranks in real processes, transport="verbs". Rank 0 streams windows of WINDOW messages to rank 1
through `_C._stream` (isend/irecv looped in C++), each window answered by a 1 B acknowledgement, so
per-message handshakes overlap as perftest's 128 outstanding writes do; a ping-pong adds them up
instead. Rank 1 lands every message of a window in its own slice and checks the last window byte for
byte. Writes the median window's bandwidth in MiB/s (perftest's "MB/sec" is 2^20 bytes per second)
and whether the bytes arrived intact.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

import numpy as np

from tests.dicomm.multiproc import run_ranks


def _rank(rank: int, world: int, store, nbytes: int, window: int, iters: int) -> dict:
    import dicomm._C as C
    import dicomm._C_bench as B

    c = C.Communicator(store, rank, world, 60.0, "verbs")
    out = np.random.default_rng(11).integers(0, 256, size=nbytes, dtype=np.uint8)
    land = np.zeros(nbytes * window if rank == 1 else 1, np.uint8)
    peer = 1 - rank

    def stream(n: int) -> list[int]:
        return B._stream(c, peer, out.ctypes.data, land.ctypes.data, nbytes, window, n, rank == 0, 9, 60.0)

    stream(2)  # connect, register, warm up
    land[:] = 0
    windows_ns = stream(iters)
    res: dict = {"transport": c.transport_of(peer)}
    if rank == 0:
        res["window_MiBps"] = [nbytes * window / (ns / 1e9) / (1 << 20) for ns in windows_ns]
    else:
        res["intact"] = bool(all(np.array_equal(land[w * nbytes:(w + 1) * nbytes], out) for w in range(window)))
    c.barrier().wait()
    c.close()
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--bytes", type=int, default=1 << 20)
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--iters", type=int, default=12, help="windows timed")
    args = ap.parse_args()
    if args.bytes < 1 or args.window < 1 or args.iters < 1:
        ap.error("--bytes, --window and --iters must be at least 1")
    sender, receiver = run_ranks(_rank, 2, args.bytes, args.window, args.iters, timeout=240)
    res = {"bytes": args.bytes, "window": args.window, "iters": args.iters,
           "MiBps_median": statistics.median(sender["window_MiBps"]), "window_MiBps": sender["window_MiBps"],
           "verified": receiver["intact"] and sender["transport"] == receiver["transport"] == "verbs"}
    with open(args.out, "w") as f:
        json.dump(res, f)
    print(json.dumps(res))
    return 0 if res["verified"] else 1


if __name__ == "__main__":
    sys.exit(main())
