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


def test_simulate_under_h1f1b_derives_and_writes_its_warmup(tmp_path, capsys):
    """HARP's setting (slow cross-cluster links): H-1F1B's extra warm-up comes from the plan's costs, the
    written plan carries it, and the simulator times it below 1F1B."""
    harp = ["--cluster", str(EX / "clusters" / "harp.yaml"), "--model", str(EX / "models" / "gpt-harp.yaml"),
            "--train", str(EX / "training" / "harp.yaml")]
    plan, out = tmp_path / "plan.json", tmp_path / "h.json"
    assert main(["plan", *harp, "--json", str(plan), "--no-progress"]) == 0
    times = {}
    for sched in ("1f1b", "h1f1b"):
        sim = tmp_path / f"{sched}.json"
        assert main(["simulate", str(plan), *harp, "--schedule", sched, "--json", str(sim), "--write-plan", str(out)]) == 0
        times[sched] = json.loads(sim.read_text())["iteration_time_s"]
    d = json.loads(out.read_text())
    assert d["schedule"] == "h1f1b" and len(d["schedule_params"]["extra_warmup"]) == len(d["stages"]) - 1
    assert max(d["schedule_params"]["extra_warmup"]) > 1
    assert times["h1f1b"] < times["1f1b"]
    # the plan's stated time is the simulator's (the cost model alone is ~20% optimistic on these links)
    planned = json.loads(plan.read_text())
    assert abs(planned["iteration_time_s"] / times["1f1b"] - 1) < 0.05
    assert planned["extra"]["model_estimate_s"] < 0.9 * times["1f1b"]
