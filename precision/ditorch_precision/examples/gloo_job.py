"""The command line every gloo job example starts with: ``OUT WORLD PORT`` (where it writes, how
many processes it spawns, the port of the store they join: tests serve it, see the precision
tests' conftest)."""
from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("world", type=int)
    p.add_argument("port", type=int)
    return p


@contextmanager
def joined(rank: int, world: int, port: int, barrier: bool = True) -> Iterator[None]:
    """One spawned process of the job, on one thread, in the job's gloo group while the body runs; at the
    end it waits for the others (``barrier``) before leaving the group. A body that raises leaves it at
    once (the others may never reach a barrier) and its error goes on."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        yield
        if barrier:
            dist.barrier()
    finally:
        dist.destroy_process_group()
