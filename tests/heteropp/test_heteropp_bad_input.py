"""Bad input to `heteropp run`: rejected with exit 2 and a message naming the field, before any process starts."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from heteropp.cli import main

EX = Path(__file__).resolve().parents[2] / "examples"


def _plan(tmp_path: Path, stages: list[dict], dp: int = 1) -> str:
    p = tmp_path / "plan.json"
    p.write_text(json.dumps({"stages": stages, "dp": dp, "micro_batches": 4, "micro_batch_size": 1}))
    return str(p)


GOOD = [{"chip": "big", "tp": 1, "layers": 4}, {"chip": "small", "tp": 1, "layers": 4}]


def test_run_with_a_cluster_too_small_for_the_plan(tmp_path, capsys):
    """two-cpu has 2 chips of each type; dp 4 needs 4 of each."""
    path = _plan(tmp_path, GOOD, dp=4)
    assert main(["run", "--plan", path, "--model", "tiny", "--steps", "1",
                 "--cluster", str(EX / "clusters" / "two-cpu.yaml")]) == 2
    err = capsys.readouterr().err
    assert "plan uses 4 chips of type 'big'" in err and "at most the cluster's 2" in err, err


@pytest.mark.parametrize("layers", ["4", None])
def test_run_a_plan_whose_layers_are_not_an_integer(tmp_path, capsys, layers):
    path = _plan(tmp_path, [{**GOOD[0], "layers": layers}, GOOD[1]])
    assert main(["run", "--plan", path, "--model", "tiny", "--steps", "1", "--chip-map", "big=cpu,small=cpu"]) == 2
    err = capsys.readouterr().err
    assert "'stages[0].layers'" in err and f"got {layers!r}" in err and "Traceback" not in err, err


@pytest.mark.parametrize("cmd", ["run", "reference"])
def test_negative_steps(tmp_path, capsys, cmd):
    with pytest.raises(SystemExit) as e:
        main([cmd, "--plan", _plan(tmp_path, GOOD), "--model", "tiny", "--steps", "-5"])
    assert e.value.code == 2
    assert "--steps: expected an integer >= 1, got -5" in capsys.readouterr().err


@pytest.mark.parametrize("flag,value", [("--timeout", "0"), ("--timeout", "-1"), ("--timeout", "nan"),
                                        ("--clip-grad", "-1"), ("--clip-grad", "inf")])
def test_a_timeout_or_clip_norm_that_is_not_a_positive_number(tmp_path, capsys, flag, value):
    """A zero or negative timeout fails every collective at once (or never), a negative clip norm flips
    the gradients: both are usage errors, not runs."""
    with pytest.raises(SystemExit) as e:
        main(["run", "--plan", _plan(tmp_path, GOOD), "--model", "tiny", flag, value])
    assert e.value.code == 2
    assert f"{flag}: expected a finite number > 0, got {value!r}" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["1", "0.5", "-2", "nan", "inf", "x"])
def test_a_straggler_threshold_that_is_not_above_one(tmp_path, capsys, value):
    """A threshold of 1 or less reports every stage that is not the fastest: a usage error, not a run."""
    with pytest.raises(SystemExit) as e:
        main(["run", "--plan", _plan(tmp_path, GOOD), "--model", "tiny", "--straggler-threshold", value])
    assert e.value.code == 2
    assert f"--straggler-threshold: expected a finite number > 1, got {value!r}" in capsys.readouterr().err


def test_a_straggler_threshold_for_a_plan_without_estimates_is_refused(tmp_path, capsys):
    """A hand-written plan carries no est_time_s: the watch judges nothing, so the threshold would be ignored."""
    assert main(["run", "--plan", _plan(tmp_path, GOOD), "--model", "tiny", "--straggler-threshold", "3",
                 "--chip-map", "big=cpu,small=cpu"]) == 2
    err = capsys.readouterr().err
    assert "--straggler-threshold" in err and "est_time_s" in err and "Traceback" not in err, err


@pytest.mark.parametrize("value", [1.0, 0.5, float("nan"), float("inf")])
def test_a_run_config_with_a_straggler_threshold_not_above_one_is_refused(value):
    """The same rule for a run config written by hand (torchrun -m heteropp.engine.worker --config)."""
    from heteropp.engine.config import TrainOptions
    with pytest.raises(ValueError, match="straggler_threshold must be a finite number > 1"):
        TrainOptions(straggler_threshold=value)


def test_a_plan_whose_chips_used_disagrees_with_its_stages(tmp_path, capsys):
    """`chips_used` is written from the stages; a plan edited in one place and not the other is rejected."""
    from heteropp.plan import PLAN_VERSION
    p = tmp_path / "plan.json"
    p.write_text(json.dumps({"stages": GOOD, "dp": 1, "micro_batches": 4, "micro_batch_size": 1,
                             "version": PLAN_VERSION, "chips_used": {"big": 2, "small": 1}}))
    assert main(["run", "--plan", str(p), "--model", "tiny", "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert "chips_used" in err and "{'big': 1, 'small': 1}" in err, err
