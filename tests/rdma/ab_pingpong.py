"""One rank of a paired comparison of two builds (run in the guest by ab_builds.py):

    python ab_pingpong.py RANK PORT BLOCKS ITERS FIRST.so SECOND.so OUT.json

Loads both builds (modules of distinct names), makes one verbs communicator with each in this
process, then alternates 8 B ping-pong blocks of ITERS round trips between them, BLOCKS times each,
the order flipping every block. Rank 0 writes each block's median half round trip (us) per build.
"""
from __future__ import annotations

import importlib.util
import json
import os
import statistics
import sys


def load(path: str):
    name = "dicomm." + os.path.basename(path).split(".")[0]
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    if not os.path.samefile(mod.__file__, path):  # a module of that name was loaded already
        raise SystemExit(f"{path} loaded as {mod.__file__}: give each build its own module name")
    return mod


def main() -> None:
    rank, port, blocks, iters = (int(x) for x in sys.argv[1:5])
    paths, out = sys.argv[5:7], sys.argv[7]
    mods = [load(p) for p in paths]
    import numpy as np
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timeout=__import__("datetime").timedelta(seconds=120))
    sbuf, rbuf = np.zeros(8, np.uint8), np.zeros(8, np.uint8)
    peer, first = 1 - rank, rank == 0

    def pingpong(i: int, n: int) -> list[int]:
        return mods[i]._pingpong(comms[i], peer, sbuf.ctypes.data, rbuf.ctypes.data, 8, n, first, 7, 60.0)

    comms = []
    for i, m in enumerate(mods):  # in the order given: the caller alternates it between runs
        comms.append(m.Communicator(dist.PrefixStore(f"ab{i}", store), rank, 2, 60.0, "verbs"))
        pingpong(i, 200)  # connect and warm up
    medians: list[list[float]] = [[], []]
    for b in range(blocks):
        for i in ((0, 1) if b % 2 == 0 else (1, 0)):
            pingpong(i, 50)
            rt = pingpong(i, iters)
            if rank == 0:
                medians[i].append(statistics.median(rt) / 2000.0)
    for c in comms:
        c.close()
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"builds": [os.path.basename(p) for p in paths], "medians_us": medians}, f)


if __name__ == "__main__":
    main()
