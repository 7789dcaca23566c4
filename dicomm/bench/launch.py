"""Starts the benchmark's ranks as real processes on this host, sharing one c10d TCPStore.

Every rank runs `fn(rank, world_size, store, cfg)`; rank 0's return value comes back. The run has a
deadline: a rank that neither reports nor exits in time is killed and the run fails with what each
rank said. No process outlives the call.
"""
from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import platform
import queue
import time
import traceback
from typing import Any, Callable


class BenchFailure(RuntimeError):
    """A rank failed or the run outlived its deadline; the message holds each rank's story."""


def _child(fn, rank, world_size, port_pipe, cfg, results):
    # One compute thread per rank: the ranks share the host's cores with each other.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        if not port_pipe.poll(cfg.op_timeout):
            raise TimeoutError(f"no store port from the launcher within {cfg.op_timeout:.0f} s")
        store = dist.TCPStore("127.0.0.1", port_pipe.recv(), is_master=False,
                              timeout=datetime.timedelta(seconds=cfg.op_timeout))
        results.put((rank, "ok", fn(rank, world_size, store, cfg)))
    except BaseException:  # report everything, including KeyboardInterrupt
        results.put((rank, "error", traceback.format_exc()))


def run_ranks(fn: Callable[..., Any], world_size: int, cfg: Any, timeout: float) -> Any:
    """Runs fn in `world_size` processes; returns rank 0's result or raises BenchFailure."""
    import torch.distributed as dist

    # Fork before this process starts any thread (the store's server is one): the ranks inherit
    # the imported torch instead of importing it again, and learn the store's port through a pipe.
    ctx = mp.get_context("fork")
    results = ctx.Queue()
    pipes = [ctx.Pipe(duplex=False) for _ in range(world_size)]
    procs = [ctx.Process(target=_child, args=(fn, r, world_size, pipes[r][0], cfg, results),
                         daemon=True) for r in range(world_size)]
    for p in procs:
        p.start()
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=datetime.timedelta(seconds=cfg.op_timeout))
    for _, send_end in pipes:
        send_end.send(server.port)
    out: dict[int, tuple[str, Any]] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(out) < world_size and time.monotonic() < deadline:
            try:
                rank, status, value = results.get(timeout=0.2)
                out[rank] = (status, value)
                if status == "error":
                    deadline = min(deadline, time.monotonic() + 10.0)  # let the others report
            except queue.Empty:
                if all(not p.is_alive() for r, p in enumerate(procs) if r not in out):
                    break
    finally:
        for p in procs:
            p.join(timeout=max(0.1, min(5.0, deadline - time.monotonic())))
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5.0)
        del server  # stops the store's server thread before any later fork
    problems = []
    for r, p in enumerate(procs):
        if r in out and out[r][0] == "error":
            problems.append(f"--- rank {r} raised:\n{out[r][1]}")
        elif r not in out:
            why = "timed out" if p.exitcode in (None, -9) else f"exited with code {p.exitcode}"
            problems.append(f"--- rank {r} {why} without reporting (deadline {timeout:.0f} s; "
                            f"raise it with --timeout)")
    if problems:
        raise BenchFailure("benchmark run failed:\n" + "\n".join(problems))
    return out[0][1]


def machine_info() -> dict:
    """The machine the numbers come from: cores, CPU model, memory, kernel, torch version."""
    import torch

    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem_gib = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem_gib = round(int(line.split()[1]) / (1 << 20), 1)
                    break
    except OSError:
        pass
    nproc = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None
    return {"nproc": nproc, "cpu": cpu, "mem_gib": mem_gib, "kernel": platform.release(),
            "loadavg_1_5_15min": load,
            "python": platform.python_version(), "torch": torch.__version__,
            "date": datetime.datetime.now().isoformat(timespec="seconds")}
