"""Bad situations of elastic training (issue 29, point 4), each with real processes: `heteropp run --elastic`
starts one torch elastic agent (torchrun) per emulated host on this machine (processes over loopback stand in
for hosts of two chip types, gloo for the vendors' libraries). Two failures in a row, a failure while a
checkpoint is written and a failure while a new round starts (a host that comes back as another chip type is
in test_heteropp_elastic.py): none loses the last good checkpoint, the work lost is at most one checkpoint
interval, and every round that resumed trained exactly what resuming its checkpoint on its plan by hand
trains."""
from __future__ import annotations

import os
import signal
import time


from heteropp.engine.checkpoint import read_trainer
from heteropp.engine.elastic_launch import process_tree
from heteropp.spec import PRESETS

from .elastic_run import ElasticRun
from .long_tests import long_test

EVERY = 2
# 1-1.5 min each on 2 cores at load 5-7: beside `make test`, not in it
pytestmark = long_test("1-1.5 min each on 2 cores")


def test_two_failures_in_a_row_each_resume_from_the_newest_checkpoint(tmp_path) -> None:
    run = ElasticRun(tmp_path, steps=12, every=EVERY, hosts="big:2,small:1,small:1")
    # first failure: a `small` host, right after the step that follows a save (the worst case for work lost)
    run.wait_step(EVERY + 1)
    newest = run.complete()[-1]
    killed = run.kill(run.host("small"))
    second = run.wait_round(killed)
    assert second["chips"] == {"big": 2, "small": 1} and second["resume_from"] >= newest == EVERY
    # second failure: the other `small` host, once the re-planned round has saved and stepped past a save
    save = second["resume_from"] + EVERY
    run.wait_step(save + 1, after=second["time"])
    newest = run.complete()[-1]
    killed_step = max(r["step"] for r in run.steps_logged(second["time"]))
    killed = run.kill([h for h in run.events("host_started") if h["chip"] == "small"][-2])
    third = run.wait_round(killed)
    got = run.finish()
    assert third["chips"] == {"big": 2} and third["resume_from"] >= newest >= save
    assert killed_step - third["resume_from"] <= EVERY
    assert [r["chips"] for r in run.rounds()] == [{"big": 2, "small": 2}, {"big": 2, "small": 1}, {"big": 2}]
    run.check_by_hand(second, got, upto=third["resume_from"])
    run.check_by_hand(third, got)


def test_a_failure_while_a_checkpoint_is_written_resumes_from_the_one_before(tmp_path) -> None:
    run = ElasticRun(tmp_path, steps=10, every=EVERY)
    run.wait_step(EVERY + 1)  # the checkpoint of step EVERY is complete
    partial = run.ck / f"step-{2 * EVERY:08d}.partial"
    run.wait(partial.is_dir, "the second checkpoint's writing", timeout=240)
    killed = run.kill(run.host("small"))  # its ranks are writing their slices
    assert not (run.ck / f"step-{2 * EVERY:08d}").exists(), "the kill came after the checkpoint was complete"
    second = run.wait_round(killed)
    got = run.finish()
    assert second["chips"] == {"big": 2} and second["resume_from"] == EVERY
    read_trainer(run.ck / f"step-{EVERY:08d}", PRESETS["tiny"])  # whole: every file's SHA-256 as written
    # the broken attempt was replaced when the step was saved again
    assert not list(run.ck.glob("*.partial")) and 2 * EVERY in run.complete()
    run.check_by_hand(second, got)


def test_a_failure_while_the_new_round_starts_is_one_more_restart(tmp_path) -> None:
    run = ElasticRun(tmp_path, steps=10, every=EVERY, timeout_s=15, max_restarts=4)
    run.wait_step(EVERY + 1)
    newest = run.complete()[-1]
    big = run.host("big")
    before = set(process_tree(big["pid"]))
    workers = sorted(before - {big["pid"]})
    killed = time.time()
    os.kill(workers[-1], signal.SIGKILL)  # one worker: its agent restarts the host's workers, a new round
    # the new round is starting: the agent has started new workers (importing torch, joining the round)
    run.wait(lambda: set(process_tree(big["pid"])) - before, "the big host's new workers", timeout=120)
    assert not any(run.steps_logged(r["time"]) for r in run.rounds() if r["started"] > killed), "it had started"
    run.kill(run.host("small"))
    rnd = run.wait_round(killed)
    got = run.finish()
    final = run.rounds()[-1]
    assert final["chips"] == {"big": 2} and final["resume_from"] >= newest
    assert rnd["resume_from"] <= final["resume_from"]
    run.check_by_hand(final, got)
