"""A process forked inside a C++-hooked stats capture (os.fork, a fork-started worker) inherits the
observer and its index writer, but not the writer's thread: the child must neither hang on that
thread when its copy of the capture ends nor append lines to the parent's index, nor write its
meta.json over the parent's. The reference is
the same program run without the fork, in one process. Real processes, CPU tensors."""
import json
import os
import subprocess
import sys

import pytest

from ditorch_precision import native

pytestmark = pytest.mark.skipif(not native.available(), reason=f"C++ module not built: {native.why_not()}")

_PROGRAM = r"""
import os, sys, time
import torch
from ditorch_precision import Capture

path, fork = sys.argv[1], sys.argv[2] == "fork"
torch.set_num_threads(1)
with torch.no_grad(), Capture(path, mode="stats", hook="cpp") as cap:
    torch.ones(2, 3).add(1)
    cap.step()
    torch.arange(5).sum()
    pid = os.fork() if fork else 1
    if pid == 0:  # the child's own ops, handed over at its step and at its copy's end
        torch.zeros(4).mul(2)
        cap.step()
        torch.full((2,), 3.0).neg()
        time.sleep(1)  # the parent ends its capture first: a child writing meta.json would write the last one
    else:
        torch.ones(4).mul(2)
if pid == 0:
    os._exit(0)
if fork:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            print("child exit", os.waitstatus_to_exitcode(status))
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        print("child hung")
"""


def _run(path: str, fork: str) -> tuple[str, list[tuple[str, int]], dict]:
    out = subprocess.run([sys.executable, "-c", _PROGRAM, path, fork], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    with open(os.path.join(path, "index.jsonl")) as f:
        lines = [json.loads(line) for line in f]
    with open(os.path.join(path, "meta.json")) as f:
        meta = json.load(f)
    return out.stdout.strip(), [(r["op"], r["index"]) for r in lines], meta


def test_a_child_forked_in_a_cpp_capture_ends_and_leaves_the_parents_index_as_one_process_writes_it(tmp_path):
    _, alone, alone_meta = _run(str(tmp_path / "alone"), "none")
    said, forked, meta = _run(str(tmp_path / "forked"), "fork")
    assert said == "child exit 0"
    assert forked == alone
    assert meta["n_records"] == alone_meta["n_records"] == len(alone)
