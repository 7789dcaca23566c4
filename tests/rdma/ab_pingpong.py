"""One rank of a paired comparison of two builds (run in the guest by ab_builds.py):

    python ab_pingpong.py RANK PORT BLOCKS ITERS FIRST SECOND OUT.json [TRANSPORT]

FIRST and SECOND name a build each: `CORE.so,BENCH.so` (a renamed engine module and its benchmark
module, as ab_builds.py makes them) or `installed` (dicomm._C and dicomm._C_bench as installed;
`installed installed` is an A/A run). Makes one communicator (TRANSPORT, default verbs) with each
build in this process, then alternates 8 B ping-pong blocks of ITERS round trips between them,
BLOCKS times each, the order flipping every block. The round trips are the benchmark module's
`_pingpong` (a C++ loop over the Communicator). Rank 0 writes each block's median half round trip
(us) per build.
"""
from __future__ import annotations

import importlib
import importlib.util
import json
import os
import statistics
import sys
from types import ModuleType


def _load_as(name: str, path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"{path} is not a loadable module")
    mod = importlib.util.module_from_spec(spec)
    # In sys.modules before it runs: the benchmark module imports its engine module by name.
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    if not os.path.samefile(mod.__file__, path):  # a module of that name was loaded already
        raise SystemExit(f"{path} loaded as {mod.__file__}: give each build its own module name")
    return mod


def load(build: str) -> tuple[ModuleType, ModuleType]:
    """(engine module, benchmark module) of one build."""
    if build == "installed":
        return importlib.import_module("dicomm._C"), importlib.import_module("dicomm._C_bench")
    core, _, bench = build.partition(",")
    if not bench:
        raise SystemExit(f"build '{build}': expected CORE.so,BENCH.so or 'installed'")
    name = "dicomm." + os.path.basename(core).split(".")[0]
    return _load_as(name, core), _load_as(name + "_bench", bench)


def main() -> None:
    rank, port, blocks, iters = (int(x) for x in sys.argv[1:5])
    builds, out = sys.argv[5:7], sys.argv[7]
    transport = sys.argv[8] if len(sys.argv) > 8 else "verbs"
    mods = [load(b) for b in builds]
    import numpy as np
    import torch.distributed as dist

    # AB_STORE_SERVED=1: the caller already serves the store on that port (no free port to race for).
    serves = rank == 0 and os.environ.get("AB_STORE_SERVED") != "1"
    store = dist.TCPStore("127.0.0.1", port, 2, serves, timeout=__import__("datetime").timedelta(seconds=120))
    sbuf, rbuf = np.zeros(8, np.uint8), np.zeros(8, np.uint8)
    peer, first = 1 - rank, rank == 0

    def pingpong(i: int, n: int) -> list[int]:
        return mods[i][1]._pingpong(comms[i], peer, sbuf.ctypes.data, rbuf.ctypes.data, 8, n, first, 7, 60.0)

    comms = []
    for i, (core, _) in enumerate(mods):  # in the order given: the caller alternates it between runs
        comms.append(core.Communicator(dist.PrefixStore(f"ab{i}", store), rank, 2, 60.0, transport))
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
        names = [os.path.basename(b.partition(",")[0]) for b in builds]
        with open(out, "w") as f:
            json.dump({"builds": names, "medians_us": medians}, f)


if __name__ == "__main__":
    main()
