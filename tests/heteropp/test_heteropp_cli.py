"""The command line end to end (`heteropp run`, `heteropp reference`, then the loss-curve check), plans
rejected before any process starts, and a dying stage process making the run fail instead of hang.

Processes on one host stand in for chips of two types; CPU tensors and gloo stand in for device tensors
and the chips' native collective libraries inside a stage.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

import ditorch_precision
from heteropp.cli import main
from heteropp.engine import launch
from tests.heteropp.heteropp_helpers import config, plan

REPO = Path(__file__).resolve().parents[2]


def _write_plan(tmp_path, stages, **kw) -> str:
    path = tmp_path / "plan.json"
    p = plan(stages, **kw)
    p.num_layers = None
    path.write_text(json.dumps(p.to_dict()))
    return str(path)


def test_run_and_reference_agree_through_the_loss_check(tmp_path, capfd) -> None:
    """The tiny preset (8 layers), TP 1 -> 2 on chips A and B, three steps of ZB-H1, dicomm between stages."""
    path = _write_plan(tmp_path, [(1, 3, True), (2, 5, False)])
    run_log, ref_log = str(tmp_path / "run.jsonl"), str(tmp_path / "ref.jsonl")
    assert main(["run", "--plan", path, "--model", "tiny", "--steps", "3", "--schedule", "zbh1", "--backend", "dicomm",
                 "--chip-map", "A=cpu,B=cpu", "--loss-log", run_log]) == 0
    assert main(["reference", "--model", "tiny", "--steps", "3", "--plan", path, "--loss-log", ref_log]) == 0
    # Per-step lines come from the ranks, whose stdout is that of the shared forkserver (started by whichever
    # test came first), so only the launcher's own summary is checked here; the loss log covers every step.
    out = capfd.readouterr().out
    assert "heteropp run: 3 steps, final loss" in out and "tokens/s" in out
    lines = [json.loads(x) for x in open(run_log)]
    assert [x["step"] for x in lines] == [1, 2, 3]
    report = ditorch_precision.loss_check(run_log, ref_log)
    assert report.passed and report.mre < 1e-5, report


@pytest.mark.parametrize("stages,extra,field", [
    ([(1, 3, False), (1, 4, False)], [], "layers sum to 7"),
    ([(1, 4, False), (1, 4, False)], ["--world-size", "3"], "plan needs 2 ranks"),
    ([(8, 4, False), (1, 4, False)], [], "stages[0].tp"),
    ([(1, 4, False), (1, 4, False)], ["--chip-map", "A=cpu"], "plan chip type 'B' maps to no ditorch adapter"),
])
def test_malformed_plans_are_rejected_with_the_reason(tmp_path, capsys, stages, extra, field) -> None:
    path = _write_plan(tmp_path, stages)
    args = ["run", "--plan", path, "--model", "tiny", "--steps", "1"] + (extra or [])
    if "--chip-map" not in args:
        args += ["--chip-map", "A=cpu,B=cpu"]
    t0 = time.monotonic()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert field in err, err
    assert time.monotonic() - t0 < 5, "rejection must come before any process starts"


def test_a_dying_stage_makes_the_run_fail_not_hang() -> None:
    cfg = config(plan([(2, 3, False), (1, 1, False)]), ("1f1b",), fail_rank=2)
    cfg.timeout_s = 30
    t0 = time.monotonic()
    with pytest.raises(ChildFailedError) as info:
        launch(cfg)
    assert "injected failure" in str(info.value) or "rank      : 2" in str(info.value)
    assert time.monotonic() - t0 < 60


def test_every_heteropp_job_gets_its_own_dicomm_secret(monkeypatch) -> None:
    """Without DICOMM_JOB_SECRET a same-user process reading the store could take a rank's place: each launch
    draws a fresh one for all its ranks (two launches from one process, whose ranks fork from one server)."""
    import hashlib

    from heteropp.engine import RunConfig, launch
    from tests.heteropp.heteropp_helpers import MODEL, plan

    monkeypatch.delenv("DICOMM_JOB_SECRET", raising=False)
    p = plan([(1, 2, False), (1, 2, False)], micro_batches=2)
    digests = []
    for _ in range(2):
        res = launch(RunConfig(plan=p.to_dict(), model=RunConfig.model_dict(MODEL), steps=1, backend="dicomm",
                               chip_map={"A": "cpu", "B": "cpu"}))
        seen = {r[p.schedule]["secret_digest"] for r in res.values()}
        assert len(seen) == 1  # one secret for the whole job
        digests.append(seen.pop())
    empty = hashlib.sha256(b"").hexdigest()[:12]
    assert empty not in digests and digests[0] != digests[1]


_LAUNCH_AND_REPORT_HUGE_PAGES = """
from heteropp.engine import RunConfig, launch
from tests.heteropp.heteropp_helpers import MODEL, plan
p = plan([(1, 2, False), (1, 2, False)], micro_batches=2)
res = launch(RunConfig(plan=p.to_dict(), model=RunConfig.model_dict(MODEL), steps=1, backend="dicomm",
                       chip_map={"A": "cpu", "B": "cpu"}))
print("HUGE", [r[p.schedule]["huge_page_tensors"] for r in res.values()])
"""


@pytest.mark.parametrize("user_value, expected", [(None, True), ("0", False)])
def test_heteropp_ranks_allocate_in_huge_pages(user_value, expected) -> None:
    """dicomm's copies between ranks cost least when tensors are in transparent huge pages: `heteropp run`
    sets THP_MEM_ALLOC_ENABLE=1 for its ranks unless the user set it (then the user's value holds). Each
    launch runs in a fresh process, as `heteropp run` does: ranks fork from the process's fork server,
    whose environment is the one it started with (docs/architecture.md)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    if user_value is not None:
        env["THP_MEM_ALLOC_ENABLE"] = user_value
    out = subprocess.run([sys.executable, "-c", _LAUNCH_AND_REPORT_HUGE_PAGES], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"HUGE {[expected, expected]}" in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]


def test_a_rank_that_fails_is_reported_in_one_line_naming_it_and_why(tmp_path) -> None:
    """Before: 85 lines of torch elastic's logs (the rank's traceback twice, the processes it stopped) and the
    launcher's own traceback, the reason buried in them. The reference: the stage's vendor, not usable here."""
    path = _write_plan(tmp_path, [(1, 4, False), (1, 4, False)])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DIOPI", "DITORCH"))}
    done = subprocess.run([sys.executable, "-m", "heteropp", "run", "--plan", path, "--model", "tiny", "--steps",
                           "1", "--chip-map", "A=cpu,B=diopi"], capture_output=True, text=True, timeout=180, env=env,
                          cwd=REPO)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and len(lines) <= 2, done.stderr
    assert lines[-1].startswith("heteropp run: error: rank 1 failed: ValueError: stage 1 (chip type 'B') runs on "
                                "vendor 'diopi', which is not usable on this host"), done.stderr


def test_a_failure_line_says_the_signal_or_exit_code_where_no_exception_was_reported(tmp_path) -> None:
    """A rank killed by a signal, or one that exited without torch elastic's error file (whose message then
    only says how to enable tracebacks), and one that left its exception in the file."""
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    from heteropp.engine.launch import failure_lines

    reported = tmp_path / "error.json"
    reported.write_text(json.dumps({"message": {"message": "ValueError: stage 1 is not usable here",
                                                "extraInfo": {"py_callstack": "Traceback ...", "timestamp": "0"}}}))
    err = ChildFailedError("worker", {2: ProcessFailure(0, 100, -9, str(tmp_path / "none.json")),
                                      0: ProcessFailure(1, 101, 3, str(tmp_path / "none.json")),
                                      1: ProcessFailure(2, 102, 1, str(reported))})
    assert failure_lines(err) == ["rank 0 failed: exit code 3 (no error file)",
                                  "rank 1 failed: ValueError: stage 1 is not usable here",
                                  "rank 2 failed: killed by SIGKILL"]
