"""auto against h2 under the simulator (the judge of plan quality), and against brute force under its own
objective, on random small clusters and on every example experiment's shape."""
from __future__ import annotations

import random

import pytest

from heteropp.auto.h2 import search_h2
from heteropp.auto.reference import reference_search
from heteropp.auto.plan_sim import simulate_stages
from heteropp.auto.search import search_auto
from heteropp.spec import InfeasibleError

from heteroauto_helpers import chip, make_problem


def random_case(seed: int) -> dict:
    rng = random.Random(seed)
    names = ["X", "Y", "Z"][:rng.choice([2, 2, 3])]
    chips = [chip(n, rng.choice([2, 4]), rng.uniform(6.0, 30.0), tp_max=rng.choice([1, 2]),
                  net=rng.choice([1.0, 10.0])) for n in names]
    links = [{"between": names[:2], "bandwidth": rng.choice([0.002, 0.05])}] if rng.random() < 0.3 else []
    return dict(chips=chips, speeds={n: rng.uniform(0.3, 1.5) for n in names}, layers=rng.randint(4, 8),
                gb=rng.choice([2, 4, 8]), act_gb=rng.uniform(0.3, 2.0), links=links)


def _sim(cm, cand) -> float:
    return simulate_stages(cm, cand.stages, cand.dp).iteration_time_s


# The 1F1B estimate (costs.py) is loose for short pipelines with few micro-batches, so near-ties under the
# model can flip in simulation: 73 and 219 needed the wide re-rank margin, 99 h2's own sharding of auto's
# dp and TP sizes in the re-ranked set.
@pytest.mark.parametrize("seed", list(range(120)) + [219])
def test_auto_not_worse_than_h2_in_simulation(seed):
    cm = make_problem(**random_case(seed))
    try:
        h2 = search_h2(cm, group_size=2)
    except InfeasibleError:
        pytest.skip("h2 finds no plan")
    auto = search_auto(cm, group_size=2)
    assert _sim(cm, auto.best) <= _sim(cm, h2.best) * (1 + 1e-9)


@pytest.mark.parametrize("seed", range(6))
def test_auto_is_brute_force_optimum_on_random_cases(seed):
    case = random_case(100 + seed)
    case["layers"] = min(case["layers"], 6)
    cm = make_problem(**case)
    want = reference_search(cm, group_size=2)
    if want == float("inf"):
        with pytest.raises(InfeasibleError):
            search_auto(cm, group_size=2)
        return
    assert search_auto(cm, group_size=2, rerank=False).best.time_s == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize("cluster,model,train", [
    ("harp", "models/gpt-harp.yaml", "harp"), ("two-cpu", "tiny", "tiny")])
def test_examples_auto_not_worse_than_h2_in_simulation(cluster, model, train):
    """The small examples (the paper-scale ones run in the benchmark)."""
    from pathlib import Path
    from heteropp.auto.planning import load_problem
    ex = Path(__file__).resolve().parents[2] / "examples"
    pb = load_problem(str(ex / "clusters" / f"{cluster}.yaml"), str(ex / model) if "/" in model else model,
                      str(ex / "training" / f"{train}.yaml"))
    h2, auto = search_h2(pb.cm), search_auto(pb.cm)
    assert _sim(pb.cm, auto.best) <= _sim(pb.cm, h2.best) * (1 + 1e-9)
