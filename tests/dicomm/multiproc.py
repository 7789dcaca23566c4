"""Run a function in N real processes that share a real c10d TCPStore.

Children come from a forkserver that has imported torch once, so each rank starts in milliseconds
and never inherits a parent's OpenMP or progress threads. The function must be importable (defined
at module level). Every run has a deadline: a rank that neither reports nor exits in time is killed
and the run fails with what each rank said. A rank that reported must then exit cleanly: its exit
hooks run (as at the end of a script), and a rank that hangs there or exits with an error code
fails the run too.
"""
from __future__ import annotations

import atexit
import datetime
import multiprocessing as mp
import os
import queue
import time
import traceback
from typing import Any, Callable, Iterable

_CTX = mp.get_context("forkserver")
_CTX.set_forkserver_preload(["torch", "torch.distributed"])


EXIT_GRACE_S = 10.0  # how long a rank that reported may take to exit


class RankFailure(AssertionError):
    """One or more ranks failed; the message holds each failing rank's traceback."""


def _child(fn, rank, world_size, port, args, env, results):
    os.environ.update(env)
    try:
        import torch.distributed as dist

        store = dist.TCPStore("127.0.0.1", port, is_master=False,
                              timeout=datetime.timedelta(seconds=60))
        results.put((rank, "ok", fn(rank, world_size, store, *args)))
    except BaseException:  # report everything, including SystemExit and KeyboardInterrupt
        results.put((rank, "error", traceback.format_exc()))
    results.close()
    results.join_thread()  # the report is delivered before anything at exit can go wrong
    # A multiprocessing child ends in os._exit, which skips the exit hooks a script's end runs
    # (dicomm closes open communicators there): run them, so a hang in them shows.
    atexit._run_exitfuncs()


def store_server() -> Any:
    """A TCPStore server on a free loopback port, for the ranks of run_ranks (its `server`)."""
    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=60))


def run_ranks(fn: Callable[..., Any], world_size: int, *args: Any, timeout: float = 60.0,
              env: dict[str, str] | None = None, expect_dead: Iterable[int] = (), server: Any = None) -> list[Any]:
    """Runs fn(rank, world_size, store, *args) in world_size processes; returns their results.

    Ranks in `expect_dead` may exit without reporting (tests that kill a peer); their result is None.
    `server`: a TCPStore server (is_master) the ranks share, to run them on a store an earlier run wrote
    into (None: a fresh one).
    """

    expect_dead = set(expect_dead)
    if server is None:
        server = store_server()
    results = _CTX.Queue()
    env = {k: str(v) for k, v in (env or {}).items()}
    procs = [_CTX.Process(target=_child, args=(fn, r, world_size, server.port, args, env, results),
                          daemon=True) for r in range(world_size)]
    for p in procs:
        p.start()
    out: dict[int, tuple[str, Any]] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(out) < world_size and time.monotonic() < deadline:
            try:
                rank, status, value = results.get(timeout=0.1)
                out[rank] = (status, value)
            except queue.Empty:
                # Stop waiting once every rank that has not reported has exited.
                if all(not p.is_alive() for r, p in enumerate(procs) if r not in out):
                    time.sleep(0.2)  # let queue feeder threads of exiting ranks flush
                    while True:
                        try:
                            rank, status, value = results.get_nowait()
                            out[rank] = (status, value)
                        except queue.Empty:
                            break
                    break
    finally:
        # A rank that reported gets until the deadline, and at least EXIT_GRACE_S, to exit.
        exit_deadline = max(deadline, time.monotonic() + EXIT_GRACE_S)
        for p in procs:
            p.join(timeout=max(0.0, exit_deadline - time.monotonic()))
        hung = {r for r, p in enumerate(procs) if p.is_alive()}
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    problems = []
    for r, p in enumerate(procs):
        if r in out and out[r][0] == "error":
            problems.append(f"--- rank {r} raised:\n{out[r][1]}")
        elif r in out and r in hung:
            problems.append(f"--- rank {r} reported, then did not exit within {EXIT_GRACE_S:.0f} s "
                            f"(hung at exit; killed)")
        elif r in out and p.exitcode != 0:
            problems.append(f"--- rank {r} reported, then exited with code {p.exitcode}")
        elif r not in out and r not in expect_dead:
            why = "timed out" if p.exitcode in (None, -9) else f"exited with code {p.exitcode}"
            problems.append(f"--- rank {r} {why} without reporting (run timeout {timeout:.0f} s)")
    if problems:
        raise RankFailure("\n".join(problems))
    return [out[r][1] if r in out else None for r in range(world_size)]


def init_process_group(backend: str, rank: int, world_size: int, store, timeout_s: float = 30.0,
                       prefix: str = "") -> None:
    """Initialises the default group on the harness store (a fresh prefix per group)."""
    import torch.distributed as dist

    dist.init_process_group(backend=backend, store=dist.PrefixStore(prefix or backend, store),
                            rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout_s))
