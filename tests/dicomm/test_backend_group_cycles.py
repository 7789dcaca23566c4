"""Creating and destroying groups over and over leaks nothing (issue 27, point 5): after a warm-up,
each rank's open descriptors and threads come back to where they were, and its resident memory
stays flat, over many new_group + destroy_process_group(group) cycles (gloo's behaviour)."""
from __future__ import annotations

import os

import torch

from tests.dicomm.multiproc import init_process_group, run_ranks

CYCLES = int(os.environ.get("DICOMM_GROUP_CYCLES", "100"))
WARMUP = 5


def _resources() -> dict[str, int]:
    rss_pages = int(open("/proc/self/statm").read().split()[1])
    return {"fds": len(os.listdir("/proc/self/fd")), "threads": len(os.listdir("/proc/self/task")),
            "rss_mb": rss_pages * os.sysconf("SC_PAGE_SIZE") // (1 << 20)}


def _cycles(rank, world, store, cycles):
    import torch.distributed as dist

    init_process_group("dicomm", rank, world, store)
    seen = []
    for i in range(WARMUP + cycles):
        g = dist.new_group(list(range(world)), backend="dicomm")
        t = torch.full((1 << 16,), float(rank + i))
        dist.all_reduce(t, group=g)
        assert t[0].item() == sum(r + i for r in range(world))  # the reference: arithmetic
        dist.destroy_process_group(g)
        if i + 1 == WARMUP:
            seen.append(_resources())
    seen.append(_resources())
    dist.destroy_process_group()
    return seen


def test_group_create_destroy_cycles_leak_no_fds_threads_or_memory():
    for rank, (before, after) in enumerate(run_ranks(_cycles, 3, CYCLES, timeout=240)):
        assert after["fds"] <= before["fds"], f"rank {rank}: descriptors {before['fds']} -> {after['fds']}"
        # The completer pool may add a thread when two completions overlap (it shrinks when idle);
        # a leak would add one per cycle.
        threads = f"rank {rank}: threads {before['threads']} -> {after['threads']}"
        assert after["threads"] <= before["threads"] + 2, threads
        assert after["rss_mb"] - before["rss_mb"] < 40, f"rank {rank}: RSS {before['rss_mb']} -> {after['rss_mb']} MB"
