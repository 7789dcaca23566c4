"""A program whose ranks gloo_job.start runs (tests/precision/test_precision_gloo_job.py): each rank
writes its rank and process id to OUT/rankN.json; with --fail, rank 1 raises instead. Run with -m or
as a file path: the ranks must start either way, by each --start-method.
Usage: OUT [--fail] [--start-method forkserver|spawn|fork]."""
import argparse
import json
import os
from pathlib import Path

from ditorch_precision.examples import gloo_job


def worker(rank: int, out: str, fail: bool) -> None:
    if fail and rank == 1:
        raise ValueError("rank 1 failed on purpose")
    Path(out, f"rank{rank}.json").write_text(json.dumps({"rank": rank, "pid": os.getpid(), "ppid": os.getppid()}))


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--fail", action="store_true")
    p.add_argument("--start-method", default="forkserver")
    a = p.parse_args()
    gloo_job.start(worker, (a.out, a.fail), 2, a.start_method)
    print("launcher", os.getpid())
