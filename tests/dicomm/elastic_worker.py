"""A torchrun worker for the restart test: on the first attempt rank 1 SIGKILLs itself after one
all_reduce; on the next attempt every rank all-reduces again and rank 0 writes what it got.

    torchrun ... elastic_worker.py <out.json>
"""
from __future__ import annotations

import json
import os
import signal
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

import dicomm  # noqa: F401  (registers the backend)


def main(out: str) -> int:
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    dist.init_process_group("dicomm", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t)
    if attempt == 0 and rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    if attempt == 0:
        dist.barrier()  # rank 0 waits here for the peer that is gone; the agent ends it
    t = torch.full((4,), float(10 * (rank + 1) + attempt))
    dist.all_reduce(t)
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"attempt": attempt, "world": world, "sum": t.tolist()}, f)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
