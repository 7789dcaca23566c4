"""Bad input to `heteroauto`: each case exits 2 with one line naming the field, what was wrong and what was
expected, never a traceback, a hang or a plan made of nonsense numbers."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from heteropp.auto.cli import main

EX = Path(__file__).resolve().parents[2] / "examples"
TRAIN = str(EX / "training" / "tiny.yaml")
CHIP = "{name: %s, count: %s, memory_gb: 4, peak_tflops: %s, chips_per_node: 2, intra_node_bw: 5, network_bw: 2}"


def _cluster(tmp_path: Path, chips: list[str], links: list[str] = ()) -> str:
    text = "chips:\n" + "".join(f"  - {c}\n" for c in chips)
    if links:
        text += "links:\n" + "".join(f"  - {x}\n" for x in links)
    p = tmp_path / "cluster.yaml"
    p.write_text(text)
    return str(p)


def _fails(argv: list[str], capsys, *words: str) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("heteroauto: error:") and "Traceback" not in err, err
    for w in words:
        assert w in err, err
    return err


@pytest.mark.parametrize("count,tflops,field,expected", [
    ("4", ".inf", "chips[0].peak_tflops", "a finite number"),
    ("4", "1.0e+300", "chips[0].peak_tflops", "<= 1e+06"),
    ("4", "1.0e-300", "chips[0].peak_tflops", ">= 1e-06"),
    ("1.0e+15", "1", "chips[0].count", "<= 1e+12"),
    (".nan", "1", "chips[0].count", "an integer"),
])
def test_infinite_or_huge_numbers_in_a_cluster(tmp_path, capsys, count, tflops, field, expected):
    path = _cluster(tmp_path, [CHIP % ("A", count, tflops)])
    _fails(["plan", "--cluster", path, "--model", "tiny", "--train", TRAIN, "--no-progress"], capsys,
           f"'{field}'", expected)


def test_infinite_link_bandwidth(tmp_path, capsys):
    path = _cluster(tmp_path, [CHIP % ("A", 2, 1), CHIP % ("B", 2, 1)], ["{between: [A, B], bandwidth: .inf}"])
    _fails(["plan", "--cluster", path, "--model", "tiny", "--train", TRAIN, "--no-progress"], capsys,
           "'links[0].bandwidth'", "finite")


@pytest.mark.parametrize("text", ["1.2.3GB/s", "--", "e Gbps"])
def test_a_bandwidth_string_that_is_no_number(tmp_path, capsys, text):
    path = _cluster(tmp_path, [CHIP % ("A", 2, 1), CHIP % ("B", 2, 1)], [f"{{between: [A, B], bandwidth: '{text}'}}"])
    _fails(["plan", "--cluster", path, "--model", "tiny", "--train", TRAIN, "--no-progress"], capsys,
           "'links[0].bandwidth'", "'200Gbps'")


def test_a_latency_string_that_is_no_number(tmp_path, capsys):
    path = _cluster(tmp_path, [CHIP % ("A", 2, 1), CHIP % ("B", 2, 1)],
                    ["{between: [A, B], bandwidth: 1, latency: '1.2.3ms'}"])
    _fails(["plan", "--cluster", path, "--model", "tiny", "--train", TRAIN, "--no-progress"], capsys,
           "'links[0].latency'", "'1ms'")


def test_a_link_from_a_type_to_itself(tmp_path, capsys):
    path = _cluster(tmp_path, [CHIP % ("A", 2, 1), CHIP % ("B", 2, 1)], ["{between: [A, A], bandwidth: 1}"])
    _fails(["plan", "--cluster", path, "--model", "tiny", "--train", TRAIN, "--no-progress"], capsys,
           "'links[0].between'", "'A' to itself")


def test_the_same_link_given_in_both_directions(tmp_path, capsys):
    path = _cluster(tmp_path, [CHIP % ("A", 2, 1), CHIP % ("B", 2, 1)],
                    ["{between: [A, B], bandwidth: 1}", "{between: [B, A], bandwidth: 5}"])
    _fails(["plan", "--cluster", path, "--model", "tiny", "--train", TRAIN, "--no-progress"], capsys,
           "'links[1].between'", "second link between 'B' and 'A'")


def _plan(tmp_path: Path, stages: list[dict], dp: int = 1) -> str:
    p = tmp_path / "plan.json"
    p.write_text(json.dumps({"stages": stages, "dp": dp, "micro_batches": 8, "micro_batch_size": 1}))
    return str(p)


@pytest.mark.parametrize("stages,dp,words", [
    ([{"chip": "big", "tp": 2, "layers": 4}, {"chip": "small", "tp": 2, "layers": 4}], 2,
     ("plan uses 4 chips of type 'big'", "at most the cluster's 2")),
    ([{"chip": "big", "tp": 2, "layers": 4}, {"chip": "huge", "tp": 1, "layers": 4}], 1,
     ("'stages[1].chip'", "'huge' is not in the cluster")),
    ([{"chip": "big", "tp": 2, "layers": "4"}, {"chip": "small", "tp": 2, "layers": 4}], 1,
     ("'stages[0].layers'", "got '4'", "an integer >= 1")),
    ([{"chip": "big", "tp": 2, "layers": None}, {"chip": "small", "tp": 2, "layers": 4}], 1,
     ("'stages[0].layers'", "got None")),
])
def test_simulate_a_plan_the_cluster_cannot_hold_or_that_is_malformed(tmp_path, capsys, stages, dp, words):
    args = ["--cluster", str(EX / "clusters" / "two-cpu.yaml"), "--model", "tiny", "--train", TRAIN]
    _fails(["simulate", _plan(tmp_path, stages, dp), *args], capsys, *words)


def test_infeasible_names_too_many_stages_not_memory(tmp_path, capsys):
    """16 single-chip nodes with ample memory and one micro-batch: with no chip left idle every chip must
    serve in a stage and the tiny model has 8 layers, so stages, not memory, rule every plan out."""
    path = _cluster(tmp_path, [CHIP.replace("chips_per_node: 2", "chips_per_node: 1") % ("A", 16, 1)])
    train = tmp_path / "t.yaml"
    train.write_text("global_batch: 1\nmicro_batch_size: 1\ndtype: fp32\n")
    err = _fails(
        ["plan", "--cluster", path, "--model", "tiny", "--train", str(train), "--no-progress", "--idle", "never"],
        capsys,
        "fewest stages any data-parallel size allows is 16",
        "more than the 8 layers",
    )
    assert "memory" not in err


def test_infeasible_names_memory_when_the_layers_do_not_fit(tmp_path, capsys):
    path = _cluster(tmp_path, [CHIP.replace("memory_gb: 4", "memory_gb: 0.001") % ("A", 2, 1)])
    _fails(["plan", "--cluster", path, "--model", "tiny", "--train", TRAIN, "--no-progress"], capsys,
           "memory:", "fewer than the 8 layers")


def test_simulate_counts_the_chips_of_inner_replicas(tmp_path, capsys):
    """two-cpu has 2 'big' chips: one stage at tp 2 with 2 inner replicas needs 4."""
    stages = [{"chip": "big", "tp": 2, "layers": 4, "inner_dp": 2}, {"chip": "small", "tp": 2, "layers": 4}]
    p = tmp_path / "plan.json"
    p.write_text(json.dumps({"stages": stages, "dp": 1, "micro_batches": 8, "micro_batch_size": 2}))
    args = ["--cluster", str(EX / "clusters" / "two-cpu.yaml"), "--model", "tiny", "--train", TRAIN]
    _fails(["simulate", str(p), *args], capsys, "plan uses 4 chips of type 'big'")


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "soon"])
def test_a_time_budget_that_is_not_a_positive_number(capsys, value):
    with pytest.raises(SystemExit) as e:
        main(["plan", "--cluster", str(EX / "clusters" / "harp.yaml"), "--model", "tiny", "--train", TRAIN,
              "--time-budget", value])
    assert e.value.code == 2
    assert f"--time-budget: expected a finite number > 0, got {value!r}" in capsys.readouterr().err


def test_simulating_a_plan_of_whole_stages_as_interleaved_takes_the_default_chunks(tmp_path):
    """Interleaved 1F1B's chunks default to the registry's one value (1: each stage one chunk, the plan's
    stages as they are), so no error; more chunks need a plan of virtual stages, written by the planner."""
    from heteropp.schedules import kind
    out = tmp_path / "sim.json"
    assert main(["simulate", str(EX / "plans" / "harp-setting-1-h1f1b.json"), "--cluster",
                 str(EX / "clusters" / "harp.yaml"), "--model", str(EX / "models" / "gpt-harp.yaml"), "--train",
                 str(EX / "training" / "harp.yaml"), "--schedule", "interleaved", "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["schedule"] == "interleaved" and kind("interleaved").chunks(got["schedule_params"]) == 1


def test_simulating_as_interleaved_a_plan_whose_micro_batches_are_not_in_groups_of_its_stages(capsys):
    """HARP's 1F1B plan has 12 stages and 128 micro-batches: interleaved 1F1B cannot run it. The simulate
    command says so and exits 2 (it raised the schedule builder's error as a traceback)."""
    plan = EX / "plans" / "harp-setting-1.json"
    stages = len(json.loads(plan.read_text())["stages"])
    assert 128 % stages, "the example plan's stages divide its micro-batches: pick another plan"
    assert main(["simulate", str(plan), "--cluster", str(EX / "clusters" / "harp.yaml"), "--model",
                 str(EX / "models" / "gpt-harp.yaml"), "--train", str(EX / "training" / "harp.yaml"),
                 "--schedule", "interleaved"]) == 2
    err = capsys.readouterr().err
    assert "harp-setting-1.json" in err and "cannot run the plan" in err and f"{stages} stages" in err
