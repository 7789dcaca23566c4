"""The device-against-CPU example's command line: a step count below 1 would capture nothing and exit 0,
so it is refused (exit 2, naming the option) before any model is built. The example's capture itself runs
on the GPU machine (tools/gpu_checks.sh)."""
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("steps", ["0", "-1", "x"])
def test_a_step_count_below_one_is_refused(tmp_path, steps):
    done = subprocess.run([sys.executable, "-m", "ditorch_precision.examples.gpu_vs_cpu", "cpu", str(tmp_path / "c"),
                           "--steps", steps], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 2 and "--steps" in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert not (tmp_path / "c").exists()
