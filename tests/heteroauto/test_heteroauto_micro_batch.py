"""The micro-batch size searched rather than given (issue 30 item 4; heteropp/auto/micro_batch.py). The
reference is the brute force (brute_force.py: every one-chip plan and layer split, each run by the
event-loop simulator) at each size, with the analytic profile of that size; a small two-type cluster whose
link pays 50 ms a message and whose chips are too small for one type to hold the model stands in for a
slow cross-cluster link."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from heteropp.auto.analytic import analytic_profile
from heteropp.auto.brute_force import brute_force
from heteropp.auto.cli import main
from heteropp.auto.micro_batch import candidate_sizes, plan_micro_batch
from heteropp.auto.planning import make_problem
from heteropp.auto.profiles import ChipProfile
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


def _measured(cl, slow: int) -> dict:
    """Profiles per size as `heteroauto profile` writes them, here the analytic ones with size `slow`'s
    compute three times slower (a size a chip runs badly, which no analytic profile predicts)."""
    out = {}
    for s in candidate_sizes(TRAIN):
        prof = analytic_profile(cl, MODEL, replace(TRAIN, micro_batch_size=s))
        if s == slow:
            prof.chips = {c: ChipProfile({t: replace(p, fwd_s=3 * p.fwd_s, bwd_s=3 * p.bwd_s, wgrad_s=3 * p.wgrad_s)
                                          for t, p in cp.tp.items()}) for c, cp in prof.chips.items()}
        out[s] = prof
    return out


def test_measured_profiles_give_each_size_its_own_times():
    """With one measured profile per size, each size is priced under its own profile: the brute force with
    those profiles is the reference. Size 4, the analytic optimum, runs three times slower here, and the
    searched size moves to the brute force's optimum under the measured times (failed before: a measured
    profile could not be used with the size searched)."""
    cl = cluster_from_dict(CLUSTER, "test")
    profiles = _measured(cl, slow=4)
    refs = {s: brute_force(make_problem(cl, MODEL, replace(TRAIN, micro_batch_size=s), profiles[s]))[0]
            for s in profiles}
    got = plan_micro_batch(cl, MODEL, TRAIN, sorted(profiles), profiles=profiles)
    assert got.result.plan.micro_batch_size == min(refs, key=refs.__getitem__) != 4
    assert got.result.plan.iteration_time_s == pytest.approx(min(refs.values()), rel=1e-9)


def test_a_size_without_a_measured_profile_is_refused():
    cl = cluster_from_dict(CLUSTER, "test")
    profiles = _measured(cl, slow=4)
    del profiles[2]
    with pytest.raises(ValueError, match="micro-batch sizes 2: no measured profile of that size"):
        plan_micro_batch(cl, MODEL, TRAIN, [1, 2, 4], profiles=profiles)


def test_cli_searches_the_size_with_the_analytic_or_measured_profiles(tmp_path, capsys):
    spec = {"layers": 6, "hidden": 2048, "heads": 8, "kv_heads": 8, "ffn": 4096, "vocab": 1000, "seq_len": 512}
    files = {"cluster.json": CLUSTER, "model.json": spec,
             "train.json": {"global_batch": 16, "micro_batch_size": 1, "dtype": "bf16"}}
    for name, data in files.items():
        (tmp_path / name).write_text(json.dumps(data))
    profiles = _measured(cluster_from_dict(CLUSTER, "test"), slow=4)
    for s, prof in profiles.items():
        prof.save(tmp_path / f"profile-{s}.json")
    args = ["plan", "--cluster", str(tmp_path / "cluster.json"), "--model", str(tmp_path / "model.json"),
            "--train", str(tmp_path / "train.json"), "--no-progress"]
    assert main(args + ["--micro-batch-sizes", "1,4", "--json", str(tmp_path / "plan.json")]) == 0
    assert json.loads((tmp_path / "plan.json").read_text())["micro_batch_size"] == 4
    assert main(args + ["--micro-batch-sizes", "1,3"]) == 2
    assert "positive divisors of the global batch (16 sequences)" in capsys.readouterr().err
    measured = [x for s in (1, 2, 4) for x in ("--profile", str(tmp_path / f"profile-{s}.json"))]
    assert main(args + ["--micro-batch-sizes", "auto", *measured, "--json", str(tmp_path / "measured.json")]) == 0
    assert json.loads((tmp_path / "measured.json").read_text())["micro_batch_size"] == 2
    assert main(args + ["--micro-batch-sizes", "1,8", *measured]) == 2
    assert "no profile of micro-batch size 8 (the profiles hold 1, 2, 4" in capsys.readouterr().err
    assert main(args + measured) == 2  # profiles of several sizes, no size searched
    err = capsys.readouterr().err
    assert "field 'micro_batch_size': 2, while" in err and "only with --micro-batch-sizes" in err, err
