"""Work lost to a failure is at most one checkpoint interval, also with checkpoints written in the background:
the save started after step s is complete before step s + 1 is logged, so a failure at any moment finds
either the checkpoint of the newest save step or, if it strikes before step s + 1 ends, loses the steps since
the one before (at most one interval). Real processes (torch's elastic launcher, gloo over loopback) stand in
for chips; the completion time is the file system's (trainer.json is written just before the rename that
completes a checkpoint)."""
from __future__ import annotations

import json

from heteropp.engine import RunConfig, launch
from heteropp.engine.checkpoint import TRAINER, complete_checkpoints
from heteropp.plan import Plan, StagePlan

from .heteropp_helpers import MODEL


def test_a_background_save_is_complete_before_the_next_step_is_logged(tmp_path) -> None:
    plan = Plan([StagePlan("A", 1, 2), StagePlan("B", 1, 2)], dp=1, micro_batch_size=1, micro_batches=2,
                num_layers=MODEL.layers)
    log = tmp_path / "loss.jsonl"
    cfg = RunConfig(plan=plan.to_dict(), model=RunConfig.model_dict(MODEL), steps=7, backend="gloo",
                    chip_map={"A": "cpu", "B": "cpu"}, loss_log=str(log), timeout_s=60,
                    options={"checkpoint_dir": str(tmp_path / "ck"), "save_every": 2, "keep_checkpoints": 10,
                             "async_save": True})
    launch(cfg)
    logged = {r["step"]: r["time"] for r in map(json.loads, log.read_text().splitlines())}
    done = {int(p.name.split("-")[1]): (p / TRAINER).stat().st_mtime for p in complete_checkpoints(tmp_path / "ck")}
    assert sorted(done) == [2, 4, 6, 7]
    for s in (2, 4, 6):
        # the log's times are rounded to the millisecond
        assert done[s] <= logged[s + 1] + 1e-3, (s, done[s] - logged[s + 1])
