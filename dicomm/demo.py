"""A small dicomm job: `python -m dicomm.demo [--nproc 2] [--json FILE]`.

Launches workers with torch's own elastic launcher (what torchrun runs), initialises
`dist.init_process_group(backend="dicomm")` from the launcher's environment, checks an all_reduce,
and measures 8 B latency and 64 MiB bandwidth through dist.send/recv between ranks 0 and 1.
"""
from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist

from dicomm.backend import communicator_of


def _ping_pong(t: torch.Tensor, peer: int, rank: int, iters: int) -> list[float]:
    """Half round-trip times in seconds."""
    out = []
    for _ in range(iters):
        start = time.perf_counter()
        if rank == 0:
            dist.send(t, peer)
            dist.recv(t, peer)
        else:
            dist.recv(t, peer)
            dist.send(t, peer)
        out.append((time.perf_counter() - start) / 2)
    return out


def _worker(iters: int) -> dict[str, Any]:
    import dicomm  # noqa: F401  (torch's autoload registers it too)
    dist.init_process_group(backend="dicomm")
    rank, size = dist.get_rank(), dist.get_world_size()
    x = torch.full((1000,), float(rank + 1))
    dist.all_reduce(x)
    result: dict[str, Any] = {"rank": rank, "all_reduce_ok": bool((x == size * (size + 1) / 2).all())}
    if rank < 2:
        peer = 1 - rank
        small = _ping_pong(torch.zeros(2), peer, rank, iters)[iters // 10:]
        big = torch.zeros(16 << 20)  # 64 MiB
        _ping_pong(big, peer, rank, 1)
        bw = _ping_pong(big, peer, rank, 5)
        backend = communicator_of(dist.distributed_c10d._get_default_group())
        assert backend is not None, "the default group runs on dicomm"
        result.update(peer=peer, transport=backend.transport_of(peer),
                      lat_us_median=statistics.median(small) * 1e6,
                      lat_us_min=min(small) * 1e6,
                      gbps_64mib=big.nbytes / statistics.median(bw) / 1e9)
    dist.barrier()
    dist.destroy_process_group()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=2, help="worker processes (>= 2)")
    parser.add_argument("--iters", type=int, default=2000, help="8 B ping-pong iterations")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = parser.parse_args(argv)
    if args.nproc < 2:
        parser.error("--nproc must be at least 2")
    logging.getLogger("torch.distributed.elastic").setLevel(logging.WARNING)

    from torch.distributed.launcher.api import LaunchConfig, elastic_launch
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=args.nproc,
                          run_id="dicomm-demo", rdzv_backend="c10d",
                          rdzv_endpoint="127.0.0.1:0", max_restarts=0, start_method="spawn")
    results = elastic_launch(config, _worker)(args.iters)
    rows = [results[r] for r in sorted(results)]
    print(f"dicomm demo: {args.nproc} processes launched by torch's elastic launcher")
    for row in rows:
        line = f"  rank {row['rank']}: all_reduce {'ok' if row['all_reduce_ok'] else 'WRONG'}"
        if "peer" in row:
            line += (f"; to rank {row['peer']} over {row['transport']}: 8 B half round-trip "
                     f"{row['lat_us_median']:.1f} us median ({row['lat_us_min']:.1f} min), "
                     f"64 MiB {row['gbps_64mib']:.2f} GB/s")
        print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0 if all(r["all_reduce_ok"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
