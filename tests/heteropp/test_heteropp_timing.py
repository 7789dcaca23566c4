"""The executor's optional per-action timing (HETEROPP_TIMING=DIR), which the simulator benchmark reads.

A real `heteropp run` in a fresh interpreter (the variable is read at import); processes on one host
stand in for chips of two types, gloo for the links between stages.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.heteropp.heteropp_helpers import plan

STEPS, MICRO_BATCHES = 2, 4


def test_every_rank_records_each_compute_action_once_per_step(tmp_path) -> None:
    p = plan([(1, 3, False), (1, 5, False)], micro_batches=MICRO_BATCHES)
    p.num_layers = None
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(p.to_dict()))
    timing = tmp_path / "timing"
    timing.mkdir()
    env = {**os.environ, "HETEROPP_TIMING": str(timing)}
    subprocess.run([sys.executable, "-m", "heteropp", "run", "--plan", str(plan_file), "--model", "tiny",
                    "--steps", str(STEPS), "--schedule", "1f1b", "--backend", "gloo", "--chip-map", "A=cpu,B=cpu"],
                   env=env, check=True, capture_output=True, timeout=240)
    files = sorted(os.listdir(timing))
    assert files == ["rank0.jsonl", "rank1.jsonl"]
    for stage, name in enumerate(files):
        steps = [json.loads(line) for line in (timing / name).read_text().splitlines()]
        assert len(steps) == STEPS and all(s["stage"] == stage for s in steps)
        for s in steps:
            ops = [span[0] for span in s["spans"]]
            # 1F1B without a split backward: one forward and one backward per micro-batch on every stage.
            assert ops.count("F") == MICRO_BATCHES and ops.count("B") == MICRO_BATCHES, ops
            assert all(end >= start for _, _, start, end in s["spans"])
    # the same spans as a per-stage timeline in Chrome's trace format
    out = tmp_path / "trace.json"
    subprocess.run([sys.executable, "-m", "heteropp", "trace", "--timing", str(timing), "--out", str(out)],
                   check=True, capture_output=True, timeout=60)
    events = json.loads(out.read_text())["traceEvents"]
    actions = [e for e in events if e["ph"] == "X"]
    spans = sum(len(json.loads(line)["spans"]) for f in files for line in (timing / f).read_text().splitlines())
    assert len(actions) == spans and {e["pid"] for e in actions} == {0, 1}
    assert min(e["ts"] for e in actions) == 0 and all(e["dur"] >= 0 for e in actions)
    # on one host the clocks agree: stage 1's first forward starts after stage 0's first forward ends
    first = {pid: min((e for e in actions if e["pid"] == pid and e["cat"] == "F"), key=lambda e: e["ts"])
             for pid in (0, 1)}
    assert first[1]["ts"] >= first[0]["ts"] + first[0]["dur"]
