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
    ("1.0e+15", "1", "chips[0].count", "<= 16777216"),
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


def test_simulating_as_interleaved_a_plan_whose_micro_batches_are_not_in_groups_of_its_stages(tmp_path, capsys):
    """HARP's 1F1B example plan cut to 3 stages: 32 micro-batches per replica, which interleaved 1F1B
    cannot run in groups of 3. The simulate command says so and exits 2 (it raised the schedule builder's
    error as a traceback)."""
    example = json.loads((EX / "plans" / "harp-setting-1.json").read_text())
    layers = sum(s["layers"] for s in example["stages"])
    counts = (layers - 2 * (layers // 3), layers // 3, layers // 3)
    stages = [{**example["stages"][0], "layers": n, "first_layer": sum(counts[:k])} for k, n in enumerate(counts)]
    plan = tmp_path / "three-stages.json"
    plan.write_text(json.dumps({**{k: v for k, v in example.items() if k != "chips_used"}, "stages": stages}))
    assert example["micro_batches"] % 3, "the example plan's micro-batches come in groups of 3: pick another cut"
    assert main(["simulate", str(plan), "--cluster", str(EX / "clusters" / "harp.yaml"), "--model",
                 str(EX / "models" / "gpt-harp.yaml"), "--train", str(EX / "training" / "harp.yaml"),
                 "--schedule", "interleaved"]) == 2
    err = capsys.readouterr().err
    assert "three-stages.json" in err and "cannot run the plan" in err and "3 stages" in err


# issue 30: each of these gave a traceback, a plan of nonsense or silently took a value


def test_a_model_of_1e9_layers_names_the_field_and_the_limit(tmp_path, capsys):
    m = tmp_path / "m.yaml"
    m.write_text("preset: tiny\nlayers: 1.0e+9\n")
    _fails(["plan", "--cluster", str(EX / "clusters" / "two-cpu.yaml"), "--model", str(m), "--train", TRAIN,
            "--no-progress"], capsys, "'layers'", "got 1000000000", "<= 100000")


@pytest.mark.parametrize("text,field,limit", [
    ("global_batch: 1.0e+12\n", "global_batch", "<= 1048576"),
    ("global_batch_tokens: 1.0e+15\n", "global_batch_tokens", "<= 1099511627776"),
    ("global_batch: 8\nmicro_batch_size: 1.0e+12\n", "micro_batch_size", "<= 1048576"),
])
def test_a_global_batch_beyond_the_limit_names_the_field_and_the_limit(tmp_path, capsys, text, field, limit):
    t = tmp_path / "t.yaml"
    t.write_text(text)
    _fails(["plan", "--cluster", str(EX / "clusters" / "two-cpu.yaml"), "--model", "tiny", "--train", str(t),
            "--no-progress"], capsys, f"'{field}'", limit)


def test_a_chip_count_of_1e12_names_the_field_and_the_limit(tmp_path, capsys):
    path = _cluster(tmp_path, [CHIP % ("A", "1.0e+12", 1)])
    _fails(["plan", "--cluster", path, "--model", "tiny", "--train", TRAIN, "--no-progress"], capsys,
           "'chips[0].count'", "got 1000000000000", "<= 16777216")


@pytest.mark.parametrize("kind", ["yaml", "json"])
def test_a_key_given_twice_is_rejected_not_overwritten(tmp_path, capsys, kind):
    if kind == "yaml":
        t = tmp_path / "t.yaml"
        t.write_text("global_batch: 8\nmicro_batch_size: 1\nglobal_batch: 16\n")
    else:
        t = tmp_path / "t.json"
        t.write_text('{"global_batch": 8, "micro_batch_size": 1, "global_batch": 16}')
    _fails(["plan", "--cluster", str(EX / "clusters" / "two-cpu.yaml"), "--model", "tiny", "--train", str(t),
            "--no-progress"], capsys, "'global_batch'", "given twice", "each key once")


def test_a_key_given_twice_inside_a_list_names_its_path(tmp_path, capsys):
    path = _cluster(tmp_path, [CHIP % ("A", 2, 1) + "\n", ])
    text = Path(path).read_text().replace("count: 2,", "count: 2, count: 4,")
    Path(path).write_text(text)
    _fails(["plan", "--cluster", path, "--model", "tiny", "--train", TRAIN, "--no-progress"], capsys,
           "'chips[0].count'", "given twice")


@pytest.mark.parametrize("chips,got", [("{name: A, count: 2}", "got a mapping"), ("A", "got a string"),
                                       ("4", "got a number"), ("true", "got true or false")])
def test_a_list_field_given_something_else_names_it_in_the_files_terms(tmp_path, capsys, chips, got):
    """Not the parser's class names (a mapping was reported as "got _Mapping")."""
    p = tmp_path / "cluster.yaml"
    p.write_text(f"chips: {chips}\n")
    err = _fails(["plan", "--cluster", str(p), "--model", "tiny", "--train", TRAIN, "--no-progress"], capsys,
                 "'chips'", got, "a list")
    assert "_Mapping" not in err and "dict" not in err


@pytest.mark.parametrize("flag", ["--group-size"])
@pytest.mark.parametrize("value", ["0", "-2"])
def test_a_group_size_below_one(capsys, flag, value):
    with pytest.raises(SystemExit) as e:
        main(["plan", "--cluster", str(EX / "clusters" / "harp.yaml"), "--model", "tiny", "--train", TRAIN,
              flag, value])
    assert e.value.code == 2 and f"{flag}: expected an integer >= 1" in capsys.readouterr().err


def _plan_args() -> list[str]:
    return ["--cluster", str(EX / "clusters" / "two-cpu.yaml"), "--model", "tiny", "--train", TRAIN,
            "--no-progress"]


@pytest.mark.parametrize("where", ["missing-dir", "a-directory", "read-only"])
def test_an_unwritable_output_path_fails_before_the_search(tmp_path, capsys, where):
    """The path is checked first: nothing is printed before the error (the plan's table follows the search)."""
    if where == "missing-dir":
        out = tmp_path / "nowhere" / "plan.json"
    elif where == "a-directory":
        out = tmp_path
    else:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        out = ro / "plan.json"
        import os
        if os.access(ro, os.W_OK):  # root writes anywhere
            pytest.skip("this user can write into a read-only directory")
    assert main(["plan", *_plan_args(), "--json", str(out)]) == 2
    got = capsys.readouterr()
    assert got.out == "" and "'--json'" in got.err and str(out) in got.err and "Traceback" not in got.err


@pytest.mark.parametrize("flag", ["--json", "--png", "--write-plan"])
def test_simulate_checks_its_output_paths_first(tmp_path, capsys, flag):
    out = tmp_path / "nowhere" / "out"
    _fails(["simulate", str(EX / "plans" / "harp-setting-1-h1f1b.json"), "--cluster",
            str(EX / "clusters" / "harp.yaml"), "--model", str(EX / "models" / "gpt-harp.yaml"), "--train",
            str(EX / "training" / "harp.yaml"), flag, str(out)], capsys, f"'{flag}'", "does not exist")
