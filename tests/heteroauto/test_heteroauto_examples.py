"""The committed example plans are what the planner writes for their specs today (so they cannot go stale),
and the simulator reproduces the time each states."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from heteropp.auto.cli import main

EX = Path(__file__).resolve().parents[2] / "examples"
SPECS = ["--cluster", str(EX / "clusters/harp.yaml"), "--model", str(EX / "models/gpt-harp.yaml")]


def shape(d: dict) -> tuple:
    return d["dp"], d["schedule"], d["schedule_params"], [
        (s["chip"], s["tp"], s["layers"], s["recompute"], s.get("inner_dp", 1)) for s in d["stages"]]


@pytest.mark.parametrize(
    "plan,train", [("harp-setting-1.json", "harp.yaml"), ("harp-setting-1-h1f1b.json", "harp-h1f1b.yaml")]
)
def test_harp_example_plan_is_the_planners(tmp_path, plan, train):
    committed = json.loads((EX / "plans" / plan).read_text())
    out = tmp_path / "plan.json"
    assert main(["plan", *SPECS, "--train", str(EX / "training" / train), "--json", str(out), "--no-progress"]) == 0
    assert shape(json.loads(out.read_text())) == shape(committed)
    # one pipeline crossing the 5 Gbps link once: every A100 stage before every V100e stage
    chips = [s["chip"] for s in committed["stages"]]
    assert chips == sorted(chips) and len(set(chips)) == 2
    sim = tmp_path / "sim.json"
    assert main(["simulate", str(EX / "plans" / plan), *SPECS, "--train", str(EX / "training" / train),
                 "--json", str(sim)]) == 0
    assert json.loads(sim.read_text())["iteration_time_s"] == pytest.approx(committed["iteration_time_s"], rel=1e-9)
