"""The search's budget is work, not wall-clock time (issue 30): the same inputs give the same plan file,
byte for byte, on a quiet machine and with a busy loop on every core. The old budget was 3 s of wall
clock, so a loaded host stopped the best-first phase earlier and returned a different, slower plan."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.heteroauto_scenarios import slow_links
from heteropp.auto.limits import Limits
from heteropp.auto.search import search_auto

from heteroauto_helpers import make_problem, chip

ROOT = Path(__file__).resolve().parents[2]
TRAIN = str(ROOT / "examples" / "training" / "gbs-2m.yaml")


def _plan(cluster: str, out: Path, budget: int) -> bytes:
    """`heteroauto plan` in a fresh process; the plan file without search_time_s, the one field that
    records the wall clock by design."""
    subprocess.run([sys.executable, "-m", "heteropp.auto", "plan", "--cluster", cluster, "--model", "h2-100b",
                    "--train", TRAIN, "--work-budget", str(budget), "--no-progress", "--json", str(out)],
                   check=True, capture_output=True, cwd=ROOT, timeout=600)
    data = json.loads(out.read_text())
    assert data.pop("search_time_s") >= 0
    return json.dumps(data, sort_keys=True).encode()


def test_the_same_plan_quiet_and_under_a_busy_loop_on_every_core(tmp_path):
    """256 chips of 3 types on 10 Gbps / 2 ms links, the budget small enough to stop the best-first
    phase (the plan says so): the stopping point, the baselines, and so the plan, are the same with every
    core busy."""
    cluster = tmp_path / "c.json"
    cluster.write_text(json.dumps(slow_links([128, 64, 64])))
    quiet = _plan(str(cluster), tmp_path / "quiet.json", 300)
    assert "work budget 300 units" in json.dumps(json.loads(quiet)["extra"]["search"]["bounded_by"])
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)]
    try:
        time.sleep(0.5)
        busy = _plan(str(cluster), tmp_path / "busy.json", 300)
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    assert busy == quiet


def test_a_zero_work_budget_stops_at_the_first_plan_and_says_so():
    cm = make_problem([chip(n, 2, 14.0) for n in "XYZ"], {"X": 0.5, "Y": 1.0, "Z": 1.5}, layers=6, gb=4)
    r = search_auto(cm, group_size=2, rerank=False, limits=Limits(work=0), idle="never")
    assert any(b.startswith("work budget 0 units") for b in r.bounded), r.bounded
    again = search_auto(cm, group_size=2, rerank=False, limits=Limits(work=0), idle="never")
    assert again.best == r.best and again.work == r.work > 0


def test_the_optional_time_cap_says_it_stopped_the_search():
    cm = make_problem([chip(n, 2, 14.0) for n in "XYZ"], {"X": 0.5, "Y": 1.0, "Z": 1.5}, layers=6, gb=4)
    r = search_auto(cm, group_size=2, rerank=False, limits=Limits(time_cap_s=0.0), idle="never")
    assert any(b.startswith("time cap 0 s (wall clock") for b in r.bounded), r.bounded
    assert r.lower_bound_s <= r.best.time_s


@pytest.mark.parametrize("value", ["0", "-3", "1.5", "many"])
def test_a_work_budget_that_is_not_a_positive_integer(capsys, value):
    from heteropp.auto.cli import main
    with pytest.raises(SystemExit) as e:
        main(["plan", "--cluster", "c.yaml", "--model", "tiny", "--train", TRAIN, "--work-budget", value])
    assert e.value.code == 2 and "--work-budget: expected an integer >= 1" in capsys.readouterr().err
