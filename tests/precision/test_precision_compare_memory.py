"""compare's memory does not grow with the tensor bytes of the captures: a bulk capture's parts are
mapped, one at a time, and each op's tensors are cut out of the part only while that op is judged.
Measured through the peak resident memory of a process that only runs the compare: two captures
of 12 steps of 4 MiB tensors (about 190 MiB of part files each) against two of 2 steps of the same
ops (the reference: one op's float64 work is the same in both)."""
import os
import subprocess
import sys

import pytest
import torch

from ditorch_precision import Capture

STEPS = 12
SHORT = 2
N = 1 << 20  # float32 elements: 4 MiB a tensor

# The peak of the child's own memory (VmHWM): ru_maxrss would start at this process's size (Linux
# carries it through fork and exec).
_CHILD = """
import sys, torch
torch.set_num_threads(1)
from ditorch_precision import compare_dumps
if len(sys.argv) > 1:
    report = compare_dumps(sys.argv[1], sys.argv[2])
    assert report.passed and len(report.ops) == int(sys.argv[3]), (report.passed, len(report.ops))
print(next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmHWM:")))
"""


def _capture(path, steps: int) -> int:
    """A bulk capture of ``steps`` steps of 4 ops on 4 MiB tensors; its size in bytes."""
    g = torch.Generator().manual_seed(0)
    with Capture(str(path), bulk=True, max_bytes=None) as cap:
        for _ in range(steps):
            x = torch.randn(N, generator=g)
            y = torch.sin(x)
            z = y * x
            torch.add(z, y)
            cap.step()
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


# glibc moves its mmap threshold up each time a large mmapped block is freed, so later 4-8 MiB tensors come
# from the heap, whose peak then depends on fragmentation: the same compare peaked at 315 or 363-406 MiB from
# run to run. A fixed threshold maps and unmaps each such tensor: the peak is what the compare holds (315 MiB
# for both lengths in 5 runs each).
_CHILD_ENV = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(1 << 20)}


def _peak_rss(*args: str) -> int:
    out = subprocess.run([sys.executable, "-c", _CHILD, *args], capture_output=True, text=True, timeout=600,
                         env=_CHILD_ENV)
    assert out.returncode == 0, out.stderr[-2000:]
    return int(out.stdout.split()[-1])


@pytest.mark.slow
def test_compare_memory_does_not_grow_with_the_captured_bytes(tmp_path, one_thread):
    sizes = {steps: [_capture(tmp_path / f"{run}{steps}", steps) for run in "ab"][0] for steps in (SHORT, STEPS)}
    assert sizes[STEPS] - sizes[SHORT] > 150 * 2**20
    peaks = {steps: _peak_rss(str(tmp_path / f"a{steps}"), str(tmp_path / f"b{steps}"), str(4 * steps))
             for steps in (SHORT, STEPS)}  # randn, sin, mul, add a step
    # One op's float64 work on 4 MiB tensors is the same in both; the 10 more steps' parts are not held.
    assert peaks[STEPS] - peaks[SHORT] < (sizes[STEPS] - sizes[SHORT]) / 4, (peaks, sizes)
