"""bench.precision_dist_overhead refuses counts it cannot run (no step, no round) on its command line,
exit 2 naming the option and what it expects, before it starts a rank."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("option, value", [("--steps", "0"), ("--rounds", "0"), ("--rounds", "-1")])
def test_a_count_below_one_is_a_usage_error(option, value):
    p = subprocess.run([sys.executable, "-m", "bench.precision_dist_overhead", option, value], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, p.stderr[-3000:]
    assert f"argument {option}: {value!r}: expected a whole number" in p.stderr, p.stderr[-3000:]
    assert "Traceback" not in p.stderr
