"""A plan records the training spec's `zero1` it was priced with, so `heteropp run --plan` trains as priced;
a plan file written before the field existed loads as ZeRO-1 (what it was priced and run with then)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from heteropp.auto.cli import main
from heteropp.plan import Plan
from heteropp.spec.errors import SpecError

EX = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("zero1", [False, True])
def test_heteroauto_plan_writes_the_training_specs_zero1(tmp_path: Path, zero1: bool) -> None:
    train = tmp_path / "train.yaml"
    train.write_text((EX / "training" / "tiny.yaml").read_text().replace("zero1: true", f"zero1: {str(zero1).lower()}"))
    assert f"zero1: {str(zero1).lower()}" in train.read_text()
    out = tmp_path / "plan.json"
    assert main(["plan", "--cluster", str(EX / "clusters" / "two-cpu.yaml"), "--model", "tiny", "--train", str(train),
                 "--json", str(out), "--no-progress"]) == 0
    assert json.loads(out.read_text())["zero1"] is zero1
    assert Plan.load(out).zero1 is zero1


def test_a_plan_without_zero1_loads_as_zero1() -> None:
    old = {"version": 2, "stages": [{"chip": "big", "tp": 1, "layers": 8}], "dp": 2, "micro_batch_size": 1,
           "micro_batches": 4}
    assert Plan.from_dict(old).zero1 is True


def test_a_plan_whose_zero1_is_not_a_bool_is_refused() -> None:
    bad = {"version": 2, "stages": [{"chip": "big", "tp": 1, "layers": 8}], "dp": 2, "micro_batch_size": 1,
           "micro_batches": 4, "zero1": "no"}
    with pytest.raises(SpecError, match="zero1") as e:
        Plan.from_dict(bad)
    assert "true or false" in str(e.value)


def test_simulate_prices_the_plans_zero1_whatever_the_training_spec_says(tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """`heteropp run --plan` trains with the plan's zero1, so `simulate` prices that one; the reference is the
    same plan simulated under a training spec that agrees with it (dp 2, where ZeRO-1 changes the price)."""
    plan = {"version": 2, "stages": [{"chip": "big", "tp": 1, "layers": 8}], "dp": 2, "micro_batch_size": 1,
            "micro_batches": 4, "schedule": "1f1b", "zero1": False}
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(plan))
    times = {}
    for spec_zero1 in (False, True):
        train = tmp_path / f"train_{spec_zero1}.yaml"
        train.write_text((EX / "training" / "tiny.yaml").read_text()
                         .replace("zero1: true", f"zero1: {str(spec_zero1).lower()}"))
        out = tmp_path / f"sim_{spec_zero1}.json"
        assert main(["simulate", str(plan_path), "--cluster", str(EX / "clusters" / "two-cpu.yaml"), "--model", "tiny",
                     "--train", str(train), "--json", str(out)]) == 0
        times[spec_zero1] = json.loads(out.read_text())["iteration_time_s"]
        err = capsys.readouterr().err
        assert ("the plan records zero1: false" in err) is spec_zero1
    assert times[True] == times[False]
    # the same plan with ZeRO-1 is priced differently, so the equality above is not a coincidence
    plan_path.write_text(json.dumps({**plan, "zero1": True}))
    out = tmp_path / "sim_zero1.json"
    assert main(["simulate", str(plan_path), "--cluster", str(EX / "clusters" / "two-cpu.yaml"), "--model", "tiny",
                 "--train", str(tmp_path / "train_True.yaml"), "--json", str(out)]) == 0
    assert json.loads(out.read_text())["iteration_time_s"] != times[False]
