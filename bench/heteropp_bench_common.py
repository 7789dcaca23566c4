"""Shared pieces of the HeteroPP benchmarks: the bench model, machine description, launching ranks, tables."""
from __future__ import annotations

import json
import os
import platform
import shlex
import sys
import uuid
from typing import Any, Callable

from heteropp.spec import ModelSpec

# LLaMA-style, large enough that compute dominates per-call overhead on a CPU core, small enough that a
# whole benchmark stays within a few minutes on two cores.
MODEL = ModelSpec("bench", layers=8, hidden=256, heads=8, kv_heads=4, ffn=688, vocab=1024, seq_len=64)
# The smoke test's model: same shape family, seconds per run.
SMOKE_MODEL = ModelSpec("bench-smoke", layers=4, hidden=32, heads=4, kv_heads=2, ffn=64, vocab=64, seq_len=16)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine() -> dict[str, Any]:
    """nproc, CPU model and load averages (1, 5, 15 min) at the time of the call."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return {"nproc": os.cpu_count(), "cpu": cpu_model(), "loadavg": [round(x, 2) for x in load],
            "python": platform.python_version()}


def command(module: str, argv: list[str] | None) -> str:
    return " ".join(["python -m", module, shlex.join(sys.argv[1:] if argv is None else argv)]).strip()


def launch_ranks(fn: Callable[[Any], Any], arg: Any, nproc: int) -> dict[int, Any]:
    """`fn(arg)` in `nproc` local ranks through torch's elastic launcher (the engine's own launcher)."""
    import multiprocessing as mp

    from torch.distributed.launcher.api import LaunchConfig, elastic_launch
    mp.get_context("forkserver").set_forkserver_preload(["torch", "torch.distributed"])
    lc = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=f"bench-{uuid.uuid4().hex[:8]}",
                      rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0, monitor_interval=0.1,
                      start_method="forkserver")
    return elastic_launch(lc, fn)(arg)


def table(headers: list[str], rows: list[list[Any]]) -> str:
    """A markdown table (what docs/heteropp.md quotes)."""
    cells = [[f"{c:.3f}" if isinstance(c, float) else str(c) for c in r] for r in rows]
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return "\n".join(out + ["| " + " | ".join(r) + " |" for r in cells])


def write_json(path: str | None, data: dict[str, Any]) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(data, f, indent=2)
        print(f"wrote {path}")
