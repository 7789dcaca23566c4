"""The heteroauto command line on the small example cluster."""
from __future__ import annotations

import json
from pathlib import Path

from heteropp.auto.cli import main

EX = Path(__file__).resolve().parents[2] / "examples"
ARGS = ["--cluster", str(EX / "clusters" / "two-cpu.yaml"), "--model", "tiny", "--train", str(EX / "training" / "tiny.yaml")]


def test_plan_json_and_simulate(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["plan", *ARGS, "--json", str(out), "--explain", "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "bottleneck" in text and "headroom" in text and "search time" in text
    d = json.loads(out.read_text())
    assert sum(s["layers"] for s in d["stages"]) == 8
    assert d["dp"] * sum(s["tp"] for s in d["stages"]) == 4
    sim = tmp_path / "sim.json"
    assert main(["simulate", str(out), *ARGS, "--json", str(sim)]) == 0
    s = json.loads(sim.read_text())
    assert 0 <= s["bubble_fraction"] < 1 and s["iteration_time_s"] <= d["iteration_time_s"] * (1 + 1e-9)


def test_bad_input_exit_code(tmp_path, capsys):
    bad = tmp_path / "c.yaml"
    bad.write_text("chips: []\n")
    assert main(["plan", "--cluster", str(bad), "--model", "tiny", "--train", str(EX / "training" / "tiny.yaml")]) == 2
    assert "chips" in capsys.readouterr().err
