"""`python -m dicomm.demo` (what `make demo` runs) launches a real 2-process job and reports.

torch's elastic launcher on one host stands in for torchrun across nodes.
"""
from __future__ import annotations

import json
import subprocess
import sys


def test_demo_runs_a_two_process_job_and_writes_its_results(tmp_path):
    out = tmp_path / "demo.json"
    proc = subprocess.run([sys.executable, "-m", "dicomm.demo", "--iters", "50", "--json",
                           str(out)], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads(out.read_text())
    assert [r["rank"] for r in rows] == [0, 1]
    assert all(r["all_reduce_ok"] for r in rows)
    assert {r["transport"] for r in rows} == {"shm"}  # two processes on one host
    assert all(r["lat_us_median"] > 0 and r["gbps_64mib"] > 0 for r in rows)
    assert "all_reduce ok" in proc.stdout
