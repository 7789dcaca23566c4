"""compare's memory does not grow with the tensor bytes of the captures: a bulk capture's parts are
mapped, one at a time, and each op's tensors are cut out of the part only while that op is judged.
Measured on two captures of 12 steps, 4 MiB tensors (about 190 MiB of part files each), through the
peak resident memory of a process that only runs the compare, against a process that only imports
the package (the reference: what the compare itself adds)."""
import os
import resource
import subprocess
import sys

import torch

from ditorch_precision import Capture

STEPS = 12
N = 1 << 20  # float32 elements: 4 MiB a tensor

_CHILD = """
import resource, sys, torch
torch.set_num_threads(1)
from ditorch_precision import compare_dumps
if len(sys.argv) > 1:
    report = compare_dumps(sys.argv[1], sys.argv[2])
    assert report.passed and len(report.ops) == int(sys.argv[3]), (report.passed, len(report.ops))
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""


def _capture(path) -> None:
    g = torch.Generator().manual_seed(0)
    with Capture(str(path), bulk=True, max_bytes=None) as cap:
        for _ in range(STEPS):
            x = torch.randn(N, generator=g)
            y = torch.sin(x)
            z = y * x
            torch.add(z, y)
            cap.step()


def _peak_rss(*args: str) -> int:
    out = subprocess.run([sys.executable, "-c", _CHILD, *args], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return int(out.stdout.split()[-1])


def test_compare_memory_does_not_grow_with_the_captured_bytes(tmp_path, one_thread):
    threads = torch.get_num_threads()
    _capture(tmp_path / "a")
    _capture(tmp_path / "b")
    torch.set_num_threads(threads)
    captured = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(tmp_path / "a") for f in fs)
    assert captured > 150 * 2**20
    baseline = _peak_rss()
    peak = _peak_rss(str(tmp_path / "a"), str(tmp_path / "b"), str(4 * STEPS))  # randn, sin, mul, add
    # what the compare adds: a step's part of each capture and one op's float64 work, not the captures
    assert peak - baseline < captured / 3, (peak - baseline, captured)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss > 0
