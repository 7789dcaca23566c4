"""A pipeline's hand-off through `dist.batch_isend_irecv`: two ranks on this host each post a send to and a
receive from the other in one batch and wait for it (one work on dicomm, one per operation on gloo), the
path a batch's failure handling runs on. Quoted per backend and size: the median, min and p99 of one
exchange in microseconds, and the process CPU time per exchange of rank 0 (a waiting rank spins); every
backend measured in the same processes, in turn, per round.

    python -m bench.dicomm_batch_p2p [--iters 2000] [--rounds 3] [--transport shm|tcp]
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import time
from dataclasses import dataclass

SIZES = (8, 1 << 20)  # bytes


@dataclass(frozen=True)
class Config:
    iters: int
    rounds: int
    transport: str
    op_timeout: float = 60.0  # seconds: the launcher's store and the groups' collectives


def _rank(rank: int, world: int, store, cfg: Config) -> dict:
    import torch
    import torch.distributed as dist

    os.environ["DICOMM_TRANSPORT"] = cfg.transport
    dist.init_process_group("dicomm", store=dist.PrefixStore("dicomm", store), rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=cfg.op_timeout))
    iters, rounds = cfg.iters, cfg.rounds
    groups = {"dicomm": dist.group.WORLD, "gloo": dist.new_group([0, 1], backend="gloo")}
    peer = 1 - rank
    out: dict = {}
    for _ in range(rounds):
        for name, group in groups.items():
            for size in SIZES:
                send, recv = torch.ones(size // 4), torch.empty(size // 4)
                times = []
                c0 = time.process_time()
                for _ in range(iters if size < 1 << 16 else iters // 10):
                    t0 = time.perf_counter()
                    ops = [dist.P2POp(dist.isend, send, peer, group), dist.P2POp(dist.irecv, recv, peer, group)]
                    for w in dist.batch_isend_irecv(ops):
                        w.wait()
                    times.append(time.perf_counter() - t0)
                cpu = (time.process_time() - c0) / len(times)
                out.setdefault((name, size), []).append((sorted(times), cpu))
    dist.barrier()
    return {f"{k[0]} {k[1]}": v for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--transport", choices=("shm", "tcp"), default="shm")
    a = ap.parse_args()
    from dicomm.bench.launch import run_ranks

    res = run_ranks(_rank, 2, Config(a.iters, a.rounds, a.transport), timeout=1200)
    print(f"{'backend':8} {'size':>8} {'min us':>9} {'median us':>10} {'p99 us':>9} {'cpu us':>8}")
    for key, rounds in res.items():
        name, size = key.split()
        med = statistics.median(t[len(t) // 2] for t, _ in rounds) * 1e6
        low = min(t[0] for t, _ in rounds) * 1e6
        p99 = statistics.median(t[int(len(t) * 0.99)] for t, _ in rounds) * 1e6
        cpu = statistics.median(c for _, c in rounds) * 1e6
        print(f"{name:8} {int(size):>8} {low:9.1f} {med:10.1f} {p99:9.1f} {cpu:8.1f}")
    print(f"machine: {os.cpu_count()} cores, {platform.processor() or platform.machine()}; "
          f"load average at the end: {[round(x, 2) for x in os.getloadavg()]}")


if __name__ == "__main__":
    main()
