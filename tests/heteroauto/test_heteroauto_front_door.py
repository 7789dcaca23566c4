"""heteropp.auto.plan(problem, budget) is the one entry point (issue 30 item 8): it returns the plan the
search-then-to_plan sequence it replaces writes (that sequence, run here beside it, is the reference),
bounds the search by the budget's work alone, and rejects a budget it cannot honour, naming the field."""
from __future__ import annotations

from pathlib import Path

import pytest

import heteropp.auto as ha
from heteropp.auto.planning import run_search, to_plan

EX = Path(__file__).resolve().parents[2] / "examples"


def _exp_a() -> ha.Problem:
    return ha.load_problem(str(EX / "clusters" / "exp-a.yaml"), "h2-100b", str(EX / "training" / "gbs-2m.yaml"))


@pytest.mark.parametrize("algo", ["auto", "h2"])
def test_plan_is_what_search_then_to_plan_writes(algo):
    pb = _exp_a()
    got = ha.plan(pb, ha.Budget(), algo)
    res = run_search(pb, algo)
    want = to_plan(pb, res.best, None, algo, res)
    assert got.plan.stages == want.stages and got.plan.dp == want.dp
    assert got.plan.iteration_time_s == pytest.approx(want.iteration_time_s, rel=1e-12)
    assert got.plan.schedule_params == want.schedule_params
    assert got.search_time_s >= 0 and got.cpu_time_s >= 0


def test_a_small_work_budget_bounds_the_search_and_says_so():
    out = ha.plan(_exp_a(), ha.Budget(work=50, baselines=False))
    assert any("work budget 50" in b for b in out.search.bounded), out.search.bounded
    assert out.plan.extra["search"]["exact"] is False


@pytest.mark.parametrize("field, value", [("work", 0), ("time_cap_s", 0.0), ("idle", "sometimes"),
                                          ("group_size", 0)])
def test_a_budget_it_cannot_honour_names_the_field(field, value):
    with pytest.raises(ValueError, match=f"Budget.{field}"):
        ha.Budget(**{field: value})
