"""Spec loader, plan schema and schedule validation: round trips and errors that name file and field."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from heteropp.plan import Plan, StagePlan
from heteropp.schedules import Action, ScheduleError, build, validate, with_comms
from heteropp.spec import SpecError, load_cluster, load_model, load_train

EX = Path(__file__).resolve().parents[2] / "examples"


def test_examples_load():
    """Every example spec parses; Table 4's model has ~100B parameters."""
    for f in (EX / "clusters").glob("*.yaml"):
        load_cluster(f)
    m = load_model("h2-100b")
    assert 100e9 < m.total_params < 106e9
    assert load_train(EX / "training" / "gbs-2m.yaml", m.seq_len).global_batch == 512
    assert load_cluster(EX / "clusters" / "harp.yaml").link_bw("V100e", "A100") == pytest.approx(5 / 8)


def _write(tmp_path, name, data):
    p = tmp_path / name
    p.write_text(json.dumps(data))
    return p


@pytest.mark.parametrize("chip_patch,field,words", [
    ({"tp_max": 3}, "chips[0].tp_max", "power of two"),
    ({"tp_max": 16}, "chips[0].tp_max", "exceeds chips_per_node"),
    ({"memory_gb": -1}, "chips[0].memory_gb", "positive"),
    ({"network_bw": "fast"}, "chips[0].network_bw", "200Gbps"),
    ({"colour": "red"}, "chips[0].colour", "unknown field"),
])
def test_cluster_errors_name_file_and_field(tmp_path, chip_patch, field, words):
    chip = {"name": "A", "count": 8, "memory_gb": 80, "peak_tflops": 300, "chips_per_node": 8,
            "intra_node_bw": 300, "network_bw": "200Gbps", **chip_patch}
    p = _write(tmp_path, "c.json", {"chips": [chip]})
    with pytest.raises(SpecError) as e:
        load_cluster(p)
    assert str(p) in str(e.value) and f"'{field}'" in str(e.value) and words in str(e.value)


def test_training_errors(tmp_path):
    p = _write(tmp_path, "t.json", {"global_batch_tokens": 1000})
    with pytest.raises(SpecError, match="global_batch_tokens.*multiple of 4096"):
        load_train(p, 4096)
    p = _write(tmp_path, "t.json", {"global_batch": 10, "micro_batch_size": 4})
    with pytest.raises(SpecError, match="micro_batch_size"):
        load_train(p)
    with pytest.raises(SpecError, match="neither a preset nor a file"):
        load_model("no-such-model")


def test_plan_round_trip(tmp_path):
    plan = Plan(stages=[StagePlan("A", 4, 30, False), StagePlan("B", 2, 66, True)], dp=2, micro_batch_size=1,
                micro_batches=16, model="h2-100b", num_layers=96, iteration_time_s=1.5, search_time_s=0.01)
    path = tmp_path / "p.json"
    plan.save(path)
    back = Plan.load(path)
    assert back == plan
    assert back.stages[1].first_layer == 30 and back.world_size == 12 and back.chips_used() == {"A": 8, "B": 4}
    data = json.loads(path.read_text())
    assert {"iteration_time_s", "search_time_s", "dp", "micro_batches", "stages"} <= set(data)
    assert {"chip", "tp", "layers", "recompute"} <= set(data["stages"][0])


@pytest.mark.parametrize("patch,field", [
    (lambda d: d["stages"][0].update(tp=3), "stages[0].tp"),
    (lambda d: d["stages"][1].update(layers=0), "stages[1].layers"),
    (lambda d: d.update(schedule="zigzag"), "schedule"),
    (lambda d: d.update(num_layers=95), "stages[*].layers"),
    (lambda d: d["stages"][0].pop("chip"), "stages[0].chip"),
    (lambda d: d.update(dp=0), "dp"),
])
def test_plan_validation_errors(tmp_path, patch, field):
    plan = Plan(stages=[StagePlan("A", 4, 30), StagePlan("B", 2, 66)], dp=2, micro_batch_size=1, micro_batches=8,
                num_layers=96)
    d = plan.to_dict()
    patch(d)
    p = _write(tmp_path, "bad.json", d)
    with pytest.raises(SpecError) as e:
        Plan.load(p)
    assert f"'{field}'" in str(e.value) and str(p) in str(e.value)


def test_plan_engine_checks():
    plan = Plan(stages=[StagePlan("A", 4, 2), StagePlan("B", 2, 2)], dp=1, micro_batch_size=1, micro_batches=4)
    with pytest.raises(SpecError, match="world size"):
        plan.validate(world_size=8)
    with pytest.raises(SpecError, match="does not divide"):
        plan.validate(heads=6)


def test_schedules_validate_and_reject():
    for name in ("gpipe", "1f1b", "zbh1"):
        validate(with_comms(build(name, 4, 6)), 6)
    bad = build("1f1b", 2, 2)
    bad[1] = [Action("B", 0)] + [a for a in bad[1] if a != Action("B", 0)]
    with pytest.raises(ScheduleError, match="before its forward"):
        validate(bad, 2)
    dead = [[Action("F", 0), Action("F", 1), Action("B", 1), Action("B", 0)],
            [Action("F", 0), Action("B", 0), Action("F", 1), Action("B", 1)]]
    dead[0] = [Action("F", 0), Action("B", 0), Action("F", 1), Action("B", 1)]  # waits on B0 before sending F1
    dead[1] = [Action("F", 1), Action("B", 1), Action("F", 0), Action("B", 0)]
    with pytest.raises(ScheduleError, match="deadlock"):
        validate(dead, 2)
    assert Action.parse("SEND_F12") == Action("SEND_F", 12)


def test_action_op_is_an_enum_and_refuses_an_unknown_letter():
    """Every action's op is an Op member, from a generator, a parse or a letter, and still reads as its
    letter (tables keyed by letters, plan and timeline text); an op outside the list is refused when the
    action is made, naming the ones expected."""
    from heteropp.schedules import Op
    acts = [a for name in ("gpipe", "1f1b", "zbh1") for st in with_comms(build(name, 3, 4)) for a in st]
    acts += [Action.parse("RECV_B3.1"), Action("W", 2)]
    assert all(type(a.op) is Op for a in acts)
    assert Action("F", 3).op is Op.F and {"F": 1}[Op.F] == 1 and f"{Action(Op.I, 2, 1)}" == "I2.1"
    with pytest.raises(ValueError, match="unknown action op 'X'; expected one of F, B, I, W, SEND_F"):
        Action("X", 0)
