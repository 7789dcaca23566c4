"""The micro-batch size searched rather than given (issue 30 item 4; heteropp/auto/micro_batch.py). The
reference is the brute force (brute_force.py: every one-chip plan and layer split, each run by the
event-loop simulator) at each size, with the analytic profile of that size; a small two-type cluster whose
link pays 50 ms a message and whose chips are too small for one type to hold the model stands in for a
slow cross-cluster link."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from heteropp.auto.brute_force import brute_force
from heteropp.auto.cli import main
from heteropp.auto.micro_batch import candidate_sizes, plan_micro_batch
from heteropp.auto.planning import make_problem
from heteropp.spec import ModelSpec, TrainSpec, cluster_from_dict


def _chip(name: str, tflops: float) -> dict:
    return {"name": name, "count": 2, "memory_gb": 2.0, "peak_tflops": tflops, "chips_per_node": 1, "tp_max": 1,
            "intra_node_bw": 100, "network_bw": 10, "memory_fraction": 1.0}


CLUSTER = {"name": "slow-link", "chips": [_chip("X", 100), _chip("Y", 60)],
           "links": [{"between": ["X", "Y"], "bandwidth": 1.0, "latency": 0.05}]}
MODEL = ModelSpec("m", layers=6, hidden=2048, heads=8, kv_heads=8, ffn=4096, vocab=1000, seq_len=512)
TRAIN = TrainSpec(global_batch=16, micro_batch_size=1, dtype="bf16")


def test_the_searched_size_is_the_brute_force_optimum_over_sizes():
    """Every size's brute force: the searched plan is no slower than the best of them, and faster than the
    given size's best (1 sequence per micro-batch pays 16 latencies each way; 4 was 1.8x faster here)."""
    cl = cluster_from_dict(CLUSTER, "test")
    sizes = candidate_sizes(TRAIN)
    assert sizes == [1, 2, 4, 8, 16]
    refs = {s: brute_force(make_problem(cl, MODEL, replace(TRAIN, micro_batch_size=s)))[0] for s in sizes}
    got = plan_micro_batch(cl, MODEL, TRAIN, sizes)
    assert got.result.plan.iteration_time_s <= min(refs.values()) * (1 + 1e-9)
    assert got.result.plan.iteration_time_s < refs[TRAIN.micro_batch_size]
    assert got.result.plan.micro_batch_size == min(refs, key=refs.__getitem__)


def test_a_size_that_does_not_divide_the_global_batch_is_refused():
    cl = cluster_from_dict(CLUSTER, "test")
    with pytest.raises(ValueError, match="micro-batch size 3: expected a positive divisor of the global batch"):
        plan_micro_batch(cl, MODEL, TRAIN, [1, 3])


def test_cli_searches_the_size_and_refuses_it_with_a_measured_profile(tmp_path, capsys):
    spec = {"layers": 6, "hidden": 2048, "heads": 8, "kv_heads": 8, "ffn": 4096, "vocab": 1000, "seq_len": 512}
    files = {"cluster.json": CLUSTER, "model.json": spec,
             "train.json": {"global_batch": 16, "micro_batch_size": 1, "dtype": "bf16"}, "profile.json": {}}
    for name, data in files.items():
        (tmp_path / name).write_text(json.dumps(data))
    args = ["plan", "--cluster", str(tmp_path / "cluster.json"), "--model", str(tmp_path / "model.json"),
            "--train", str(tmp_path / "train.json"), "--no-progress"]
    assert main(args + ["--micro-batch-sizes", "1,4", "--json", str(tmp_path / "plan.json")]) == 0
    assert json.loads((tmp_path / "plan.json").read_text())["micro_batch_size"] == 4
    assert main(args + ["--micro-batch-sizes", "1,3"]) == 2
    assert "positive divisors of the global batch (16 sequences)" in capsys.readouterr().err
    assert main(args + ["--micro-batch-sizes", "auto", "--profile", str(tmp_path / "profile.json")]) == 2
    assert "holds the times of one micro-batch size" in capsys.readouterr().err
