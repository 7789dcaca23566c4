"""bench.dicomm_allreduce_bound end to end with a tiny buffer: real rank processes on this host's
CPU, the push algorithm (fused combine, pairwise combines, work stealing), the ring and the direct algorithm back to
back; only the results' exactness and the rows' shape are checked, never the speed.
"""
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("dicomm._C")

ROOT = Path(__file__).resolve().parents[2]


def _bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench.dicomm_allreduce_bound", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_every_algorithm_runs_back_to_back_and_reduces_exactly(tmp_path):
    out = tmp_path / "rows.json"
    p = _bench("--ranks", "3", "--mib", "1", "--iters", "2", "--warmup", "1", "--repeat", "1",
               "--algorithm", "all", "--json", str(out))
    assert p.returncode == 0, p.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert sorted(r["algorithm"] for r in rows) == ["direct", "push", "push-pairwise", "push-steal", "ring"]
    for r in rows:
        assert r["exact"] and r["ranks"] == 3 and r["thp"] is False
        for field in ("copy_ms", "bound_ms", "all_reduce_ms", "cpu_ms_all_ranks", "ratio"):
            assert math.isfinite(r[field]) and r[field] > 0, (field, r)
        assert r["vcsw_all_ranks"] >= 0 and r["ivcsw_all_ranks"] >= 0
    assert all(f"| {a} | 3 |" in p.stdout for a in ("direct", "ring", "push", "push-pairwise", "push-steal"))


def test_an_unknown_algorithm_is_refused_with_the_choices():
    p = _bench("--algorithm", "tree")
    assert p.returncode == 2
    assert "--algorithm" in p.stderr and all(a in p.stderr for a in ("push", "ring", "direct"))
