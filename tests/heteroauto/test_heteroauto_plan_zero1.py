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
