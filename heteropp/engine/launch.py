"""Start a plan's processes on this host through torch's elastic launcher (what torchrun uses)."""
from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import secrets
import uuid
from typing import Any

from .checks import check_run
from .config import RunConfig


def launch(cfg: RunConfig) -> dict[int, Any]:
    """Runs `worker(cfg)` in plan.world_size local processes; returns each rank's result. A rank that fails
    makes the launcher stop the others and raise ChildFailedError naming it."""
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from .worker import worker  # imported here so `python -m heteropp.engine.worker` runs it fresh
    plan = cfg.plan_obj
    check_run(plan, cfg.model_spec, "plan", cfg.chip_map, cfg.schedule_list())  # before any process starts
    # Ranks fork from a server that imported torch once, instead of each importing it (seconds per rank);
    # the server outlives one launch, so later launches in the same process start at once.
    mp.get_context("forkserver").set_forkserver_preload(["torch", "torch.distributed", "heteropp.engine.worker"])
    lc = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=plan.world_size,
                      run_id=f"heteropp-{uuid.uuid4().hex[:8]}", rdzv_backend="c10d", rdzv_endpoint="localhost:0",
                      max_restarts=0, monitor_interval=0.1, start_method="forkserver")
    # Every job its own dicomm secret, handed to the ranks inside their config (forked ranks inherit the
    # environment of a fork server started by an earlier job): without one a process of the same user that
    # reads the store could take a rank's place. A secret the user set is kept.
    cfg = dataclasses.replace(cfg, job_secret=os.environ.get("DICOMM_JOB_SECRET") or secrets.token_hex(16))
    # Large CPU tensors in transparent huge pages: dicomm's copies between ranks pin one page per 2 MiB
    # instead of 512 (docs/benchmarks.md). torch reads this once, at a process's first allocation, so it
    # goes into the environment the fork server and its ranks start from; a value the user set is kept.
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    return elastic_launch(lc, worker)(cfg)


def failure_lines(err: Any) -> list[str]:
    """One line per rank of torch elastic's ChildFailedError: the exception the rank raised (the last line of
    the message in the error file torch elastic keeps for it), the signal that ended it, or its exit code."""
    lines = []
    for rank, failure in sorted(err.failures.items()):
        if failure.exitcode < 0:
            why = f"killed by {failure.signal_name()}"
        elif os.path.isfile(failure.error_file):  # {"message": "Type: text", "extraInfo": {"py_callstack": ...}}
            message = failure.message
            if isinstance(message, dict):
                message = message.get("message") or message.get("extraInfo", {}).get("py_callstack", "")
            text = [line.strip() for line in str(message).splitlines() if line.strip()]
            why = text[-1] if text else f"exit code {failure.exitcode}"
        else:  # torch's own message here only says how to enable tracebacks
            why = f"exit code {failure.exitcode} (no error file)"
        lines.append(f"rank {rank} failed: {why}")
    return lines
