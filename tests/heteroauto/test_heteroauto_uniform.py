"""The uniform-1F1B baseline (H2 Table 9's ablation): its definition, and auto never losing to it."""
from __future__ import annotations

import pytest

from heteropp.auto.costs import micro_batches
from heteropp.auto.plan_sim import simulate_stages
from heteropp.auto.search import RERANK_SLACK_SMALL, search_auto
from heteropp.auto.uniform import even_layers, uniform_1f1b

from heteroauto_helpers import chip, make_problem
from test_heteroauto_vs_h2 import random_case


@pytest.mark.parametrize("L,p", [(8, 3), (96, 11), (7, 7), (5, 1)])
def test_even_layers(L, p):
    ls = even_layers(L, p)
    assert sum(ls) == L and len(ls) == p and max(ls) - min(ls) <= 1 and ls == sorted(ls)


def test_uniform_plan_is_uniform_and_fits():
    cm = make_problem([chip("X", 4, 20.0), chip("Y", 4, 12.0)], {"X": 1.0, "Y": 0.5}, layers=8, gb=8)
    u = uniform_1f1b(cm)
    assert len({s.tp for s in u.stages}) == 1
    assert max(s.layers for s in u.stages) - min(s.layers for s in u.stages) <= 1
    assert sum(s.layers * s.tp * u.dp for s in u.stages) == 8 * u.stages[0].tp * u.dp
    assert sum(s.tp for s in u.stages) * u.dp == 8  # every chip serves
    assert cm.evaluate(u.stages, u.dp, micro_batches(cm.train, u.dp), "1f1b").feasible
    assert u.time_s == pytest.approx(simulate_stages(cm, u.stages, u.dp, "1f1b").iteration_time_s, rel=1e-12)


def test_uniform_loses_to_a_layer_split_that_follows_speed():
    """One chip type twice as fast: an even split idles the fast stages, auto gives them more layers."""
    cm = make_problem([chip("X", 2, 40.0, tp_max=1), chip("Y", 2, 40.0, tp_max=1)], {"X": 2.0, "Y": 1.0},
                      layers=12, gb=16)
    u = uniform_1f1b(cm)
    a = search_auto(cm, group_size=2).best
    assert simulate_stages(cm, a.stages, a.dp).iteration_time_s < 0.9 * u.time_s


# auto re-ranks only near-optima of its model; on short pipelines with few micro-batches the model is up to
# ~9% pessimistic (RERANK_SLACK_SMALL), and 3 of 300 random cases (7, 213, 287) simulate up to 5.5% slower
# than the best uniform plan, which is chosen by the simulator itself.
@pytest.mark.parametrize("seed", list(range(40)) + [213, 287])
def test_auto_not_worse_than_uniform_in_simulation(seed):
    cm = make_problem(**random_case(seed))
    u = uniform_1f1b(cm)
    if u is None:
        pytest.skip("no uniform plan fits")
    a = search_auto(cm, group_size=2).best
    assert simulate_stages(cm, a.stages, a.dp).iteration_time_s <= u.time_s * (1 + RERANK_SLACK_SMALL)
