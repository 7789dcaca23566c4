"""dicomm-bench end to end with tiny sizes: the CLI, the JSON schema and the data checks.

Runs real rank processes on this host's CPU: gloo always, dicomm too when its backend is usable
here. Never asserts on speed, only that every value is positive and finite and that every backend
delivered the right bytes in its checked exchange.
"""
import json
import math
import subprocess
import sys
from pathlib import Path

from dicomm.bench.cli import parser
from dicomm.bench.endpoints import dicomm_status
from dicomm.bench.report import targets
from dicomm.bench.stats import MIB, RECORD_FIELDS

ROOT = Path(__file__).resolve().parents[2]
TYPES = {"backend": str, "op": str, "bytes": int, "lat_us_min": float, "lat_us_median": float,
         "lat_us_p99": float, "gbps": float, "iters": int, "world_size": int, "transport": str,
         "api": str, "verified": bool}


def _check_doc(doc: dict, kind: str, ops: set[str]) -> None:
    assert doc["schema"] == "dicomm-bench/1" and doc["kind"] == kind
    assert doc["machine"]["nproc"] >= 1 and doc["machine"]["torch"]
    records = doc["records"]
    backends = {r["backend"] for r in records}
    assert "gloo" in backends
    if not dicomm_status():
        assert {"dicomm"} <= backends
    keys = [(r["backend"], r["op"], r["bytes"]) for r in records]
    assert len(keys) == len(set(keys)), "one record per (backend, op, bytes)"
    assert {r["op"] for r in records} == ops
    for r in records:
        assert set(RECORD_FIELDS) <= set(r)
        for field, typ in TYPES.items():
            assert isinstance(r[field], typ), (field, r)
        for field in ("lat_us_min", "lat_us_median", "lat_us_p99", "gbps"):
            assert math.isfinite(r[field]) and r[field] > 0, (field, r)
        assert r["lat_us_min"] <= r["lat_us_median"] <= r["lat_us_p99"]
        assert r["bytes"] > 0 and r["iters"] >= 1 and r["world_size"] == 2
        assert r["verified"] is True, f"{r['backend']} delivered wrong data: {r}"


def test_p2p_and_coll_quick_runs_write_valid_json(tmp_path):
    runs = {}
    for kind in ("p2p", "coll"):  # both at once: most of each run is process start-up
        out = tmp_path / f"{kind}.json"
        cmd = [sys.executable, "-m", "dicomm.bench.cli", kind, "--quick", "--quiet",
               "--timeout", "100", "--op-timeout", "60", "--json", str(out)]
        runs[kind] = (out, subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE,
                                            stderr=subprocess.STDOUT, text=True))
    for kind, (out, proc) in runs.items():
        try:
            text, _ = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate(timeout=10)
        assert proc.returncode == 0, text
        assert "median us" in text  # the console table
        ops = {"p2p"} if kind == "p2p" else {"all_reduce", "all_gather", "reduce_scatter",
                                             "all_to_all"}
        _check_doc(json.loads(out.read_text()), kind, ops)


def _rec(backend, op, nbytes, lat, gbps):
    return {"backend": backend, "op": op, "bytes": nbytes, "lat_us_median": lat, "gbps": gbps}


def test_targets_compare_medians_and_bandwidths():
    m64 = 64 * MIB
    recs = [_rec("gloo", "p2p", 8, 30.0, 0.0), _rec("dicomm", "p2p", 8, 9.0, 0.0),
            _rec("gloo", "p2p", m64, 1.0, 4.0), _rec("dicomm", "p2p", m64, 1.0, 9.0),
            _rec("gloo", "all_reduce", m64, 36.0, 1.0),
            _rec("dicomm", "all_reduce", m64, 17.0, 1.0),
            _rec("dicomm-tcp", "p2p", 8, 31.0, 0.0)]
    status = [t["status"] for t in targets(recs)]
    assert status == ["PASS", "MISS", "PASS", "MISS", "n/a"]


def test_cli_has_help_and_json_for_every_run():
    ap = parser()
    for kind in ("p2p", "coll", "targets"):
        assert ap.parse_args([kind, "--json", "x.json"]).json == "x.json"
    assert ap.parse_args(["coll", "--world-size", "4"]).world_size == 4


def test_contention_hogs_run_during_the_measurement_and_are_gone_after():
    import os

    from dicomm.bench.contention import cpu_hogs

    cores = len(os.sched_getaffinity(0))
    with cpu_hogs(1) as pids:
        assert len(pids) == cores
        assert all(Path(f"/proc/{pid}").exists() for pid in pids)
        stat = Path(f"/proc/{pids[0]}/stat").read_text()
        # a live process: running, sleeping, or in uninterruptible sleep while it is still loading on a busy
        # host (not a zombie, stopped or dead one)
        assert stat.rsplit(")", 1)[1].split()[0] in "RSD"
    assert not any(Path(f"/proc/{pid}").exists() for pid in pids), "a hog outlived the run"


def test_contention_must_be_non_negative():
    done = subprocess.run([sys.executable, "-m", "dicomm.bench.cli", "p2p", "--contention", "-1"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--contention must be a non-negative" in done.stderr
