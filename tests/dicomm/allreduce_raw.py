"""Raw all_reduce timing through dicomm._C (no torch.distributed in the path), optionally next to
gloo's through torch.distributed. Processes on one host stand in for nodes.

    .venv/bin/python tests/dicomm/allreduce_raw.py --mib 64 --world 2 --iters 20 --gloo

Prints min / median / max milliseconds per all_reduce of float32 sum (rank 0's clock, each
iteration entered together after a barrier) and the CPU time rank 0's process spent per
all_reduce (all its threads; less sensitive than wall time to other load on the host). Not a
test: it asserts only that the result is right.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.dicomm.multiproc import init_process_group, run_ranks  # noqa: E402


def _time_dicomm(rank: int, world: int, store, numel: int, iters: int, warmup: int):
    import torch
    from dicomm import _C

    comm = _C.Communicator(store, rank, world, timeout_s=60.0)
    buf = torch.empty(numel, dtype=torch.float32)
    times, cpu = [], []
    for i in range(warmup + iters):
        buf.fill_(rank + 1)
        comm.barrier().wait()
        start, start_cpu = time.perf_counter(), time.process_time()
        comm.all_reduce(buf.data_ptr(), numel, "float32", "sum").wait()
        if i >= warmup:
            times.append((time.perf_counter() - start) * 1e3)
            cpu.append((time.process_time() - start_cpu) * 1e3)
    expected = world * (world + 1) / 2
    assert buf[0].item() == expected and buf[-1].item() == expected, "wrong all_reduce result"
    comm.barrier().wait()
    time.sleep(0.2)  # let the peers' last receives complete before closing
    comm.close()
    return times, cpu


def _time_gloo(rank: int, world: int, store, numel: int, iters: int, warmup: int):
    import torch
    import torch.distributed as dist

    init_process_group("gloo", rank, world, store, timeout_s=60.0, prefix="gloo_raw")
    buf = torch.empty(numel, dtype=torch.float32)
    times, cpu = [], []
    for i in range(warmup + iters):
        buf.fill_(rank + 1)
        dist.barrier()
        start, start_cpu = time.perf_counter(), time.process_time()
        dist.all_reduce(buf)
        if i >= warmup:
            times.append((time.perf_counter() - start) * 1e3)
            cpu.append((time.process_time() - start_cpu) * 1e3)
    dist.destroy_process_group()
    return times, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, default=64.0, help="buffer size in MiB (float32)")
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--gloo", action="store_true", help="also time gloo")
    args = parser.parse_args()
    numel = int(args.mib * (1 << 20)) // 4
    runs = [("dicomm", _time_dicomm)] + ([("gloo", _time_gloo)] if args.gloo else [])
    for name, fn in runs:
        times, cpu = run_ranks(fn, args.world, numel, args.iters, args.warmup, timeout=600)[0]
        print(f"{name:7s} all_reduce {args.mib:g} MiB float32 x {args.world} ranks: "
              f"min {min(times):.2f} ms  median {statistics.median(times):.2f} ms  "
              f"max {max(times):.2f} ms  cpu/rank {statistics.median(cpu):.2f} ms  "
              f"({args.iters} iters)")


if __name__ == "__main__":
    main()
