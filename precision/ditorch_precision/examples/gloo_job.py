"""The command line every gloo job example starts with: ``OUT WORLD PORT`` (where it writes, how
many processes it spawns, the port of the store they join: tests serve it, see the precision
tests' conftest)."""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("world", type=int)
    p.add_argument("port", type=int)
    p.add_argument("--start-method", default="forkserver", choices=("forkserver", "spawn", "fork"),
                   help="how the ranks are started (see start); fork only from a launcher that has run nothing")
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


def start(worker: Callable[..., None], args: tuple, world: int, method: str = "forkserver") -> None:
    """Runs ``worker(rank, *args)`` in ``world`` processes, one a rank, and waits for them (an error in
    one is raised here, as torch.multiprocessing.spawn does). By default the ranks are forked from a
    forkserver that imported the example's module (torch, ditorch_precision) once, not each a fresh
    interpreter importing torch ("spawn"): seconds of CPU a rank. The forkserver runs no operator and
    makes no group, so each rank starts as a spawned one would. "fork" forks them from this process,
    saving the forkserver's imports too: sound only while this process has run no operator, made no
    group and started no thread of its own (as an example's launcher, which only parsed its command line)."""
    if method == "forkserver":
        main = sys.modules["__main__"].__spec__  # None when run as a file path, not with -m
        context = torch.multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["torch", "torch.distributed"] + ([main.name] if main else []))
    torch.multiprocessing.start_processes(worker, args=args, nprocs=world, start_method=method)
