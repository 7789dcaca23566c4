"""`heteropp run --cluster` with a chip type in nodes of different sizes (`nodes: [2, 1, 1]`): a plan whose
TP groups cannot each sit inside one node is refused before any process starts, naming the stage; one that
fits is accepted. The reference is the node count written by hand (only one node holds two chips)."""
from __future__ import annotations

import json
from pathlib import Path

from heteropp.cli import main
from heteropp.plan import Plan, StagePlan


def _files(tmp_path: Path, tps: list[int]) -> tuple[str, str]:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("chips:\n  - {name: A, nodes: [2, 1, 1], memory_gb: 4, peak_tflops: 1, intra_node_bw: 5, "
                       "network_bw: 2, device: cpu}\n")
    layers = [8 // len(tps) + (i < 8 % len(tps)) for i in range(len(tps))]  # the tiny model's 8 layers
    plan = Plan([StagePlan("A", tp, n) for tp, n in zip(tps, layers)], dp=1, micro_batch_size=1, micro_batches=4)
    path = tmp_path / "plan.json"
    plan.save(path)
    return str(cluster), str(path)


def test_a_plan_with_two_tp2_groups_on_one_two_chip_node_is_refused(tmp_path, capsys):
    cluster, plan = _files(tmp_path, [2, 2])
    out = str(tmp_path / "run.json")
    assert main(["run", "--plan", plan, "--model", "tiny", "--steps", "1", "--cluster", cluster,
                 "--write-config", out]) == 2
    err = capsys.readouterr().err
    assert "stages[1].tp" in err and "fits in no node" in err and "Traceback" not in err, err


def test_a_plan_whose_tp_group_fits_the_two_chip_node_is_accepted(tmp_path, capsys):
    cluster, plan = _files(tmp_path, [1, 2, 1])
    out = tmp_path / "run.json"
    assert main(["run", "--plan", plan, "--model", "tiny", "--steps", "1", "--cluster", cluster,
                 "--write-config", str(out)]) == 0, capsys.readouterr().err
    assert json.loads(out.read_text())["plan"]["stages"][1]["tp"] == 2


def test_elastic_runs_refuse_the_same_plan_before_starting_a_host_per_node(tmp_path, capsys):
    """`--elastic` starts one emulated host per listed node: the plan with two TP-2 groups is refused there
    too (a TP group would span two hosts), and the one that fits is written."""
    cluster, plan = _files(tmp_path, [2, 2])
    run = ["run", "--plan", plan, "--model", "tiny", "--steps", "1", "--cluster", cluster, "--elastic",
           "--checkpoint-dir", str(tmp_path / "ck"), "--write-config", str(tmp_path / "elastic.json")]
    assert main(run) == 2
    err = capsys.readouterr().err
    assert "stages[1].tp" in err and "fits in no node" in err and "Traceback" not in err, err
    _, fits = _files(tmp_path, [1, 2, 1])
    assert main([*run[:2], fits, *run[3:]]) == 0, capsys.readouterr().err
