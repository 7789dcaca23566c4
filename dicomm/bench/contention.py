"""CPU contention for dicomm-bench: busy processes on every core while the benchmark measures.

`--contention N` starts N spinning processes per CPU of this process's affinity mask before the
ranks start and stops them when the run ends (normally, on error or on Ctrl-C), so dicomm and
gloo are compared on a loaded host as well as on a quiet one.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from typing import Iterator

_SPIN = "while True:\n    pass\n"


@contextlib.contextmanager
def cpu_hogs(per_core: int) -> Iterator[list[int]]:
    """Runs `per_core` busy processes per available CPU for the duration; yields their pids."""
    if per_core < 0:
        raise ValueError(f"--contention must be a non-negative number of hogs per core, got {per_core}")
    cores = len(os.sched_getaffinity(0))
    procs = [subprocess.Popen([sys.executable, "-c", _SPIN], stdin=subprocess.DEVNULL)
             for _ in range(per_core * cores)]
    try:
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
