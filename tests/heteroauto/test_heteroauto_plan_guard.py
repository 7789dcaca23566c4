"""The plans of a fixed set of problems stay what they were (issue 30): a change meant only to make the
planner faster must leave every plan, its runners-up and their times as they were.

The reference is data: tests/heteroauto/data/plan_check_expected.json, written once by
`python -m bench.heteroauto_plan_check --expected` (the guard's TEST_PROBLEMS: one each of the H2 paper's
clusters and HARP, and 24 random small instances under 1F1B, H-1F1B, interleaved 1F1B and ZB-H1). A change
that alters a plan on purpose regenerates it and says which plans changed in its commit. Numbers compare
to 1e-12 relative: the same arithmetic on another numpy build may round a sum's last bit differently; a
plan that changes moves them by far more. Exactness against brute force is tested in
test_heteroauto_vs_brute.py and test_heteroauto_larger_space.py."""
from __future__ import annotations

import json
import math
from typing import Any

import pytest

from bench.heteroauto_plan_check import EXPECTED, TEST_PROBLEMS, main, planned, problems

REL = 1e-12


def _differences(want: Any, got: Any, at: str = "") -> list[str]:
    """Where `got` differs from `want` (paths into the JSON), numbers to REL."""
    if isinstance(want, dict) and isinstance(got, dict):
        return [d for k in sorted(set(want) | set(got))
                for d in (_differences(want.get(k), got.get(k), f"{at}.{k}") if k in want and k in got
                          else [f"{at}.{k}: {'missing' if k in want else 'unexpected'}"])]
    if isinstance(want, list) and isinstance(got, list):
        if len(want) != len(got):
            return [f"{at}: {len(got)} items, expected {len(want)}"]
        return [d for i, (w, g) in enumerate(zip(want, got)) for d in _differences(w, g, f"{at}[{i}]")]
    numbers = (int, float)
    if isinstance(want, numbers) and isinstance(got, numbers) and not isinstance(want, bool) \
            and not isinstance(got, bool):
        return [] if math.isclose(want, got, rel_tol=REL, abs_tol=0.0) else [f"{at}: {got!r}, expected {want!r}"]
    return [] if want == got else [f"{at}: {got!r}, expected {want!r}"]


@pytest.fixture(scope="module")
def expected() -> dict:
    return json.loads(EXPECTED.read_text())


def test_the_expected_file_holds_every_test_problem(expected):
    assert sorted(expected) == sorted(TEST_PROBLEMS)


@pytest.mark.parametrize("name", TEST_PROBLEMS)
def test_the_plan_its_runners_up_and_their_times_are_unchanged(name, expected):
    got = planned(problems([name])[name], informative=False)  # not the work: a cheaper bound prunes more
    assert not _differences(expected[name], got), f"{name}: " + "; ".join(_differences(expected[name], got)[:10])


def test_the_comparison_sees_a_change_in_the_last_kept_digit_and_ignores_rounding():
    """The comparison itself (its reference: the plain equality of the values it is given)."""
    plan = {"plan": {"dp": 2, "stages": [{"chip": "A", "layers": 3}], "iteration_time_s": 1.25},
            "runners_up": [["dp=2 A:tp1x2", 1.3]]}
    assert not _differences(plan, json.loads(json.dumps(plan)))
    assert not _differences(plan, {**plan, "plan": {**plan["plan"], "iteration_time_s": 1.25 * (1 + 1e-15)}})
    assert _differences(plan, {**plan, "plan": {**plan["plan"], "iteration_time_s": 1.25 * (1 + 1e-9)}}) == [
        f".plan.iteration_time_s: {1.25 * (1 + 1e-9)!r}, expected 1.25"]
    assert _differences(plan, {**plan, "plan": {**plan["plan"], "stages": [{"chip": "A", "layers": 4}]}}) == [
        ".plan.stages[0].layers: 4, expected 3"]
    assert _differences(plan, {**plan, "runners_up": []}) == [".runners_up: 0 items, expected 1"]
    assert _differences(plan, {"plan": plan["plan"]}) == [".runners_up: missing"]


@pytest.mark.parametrize("other", [["--json", "plans.json"], ["--compare", "plans.json"]])
def test_expected_with_json_or_compare_is_refused(tmp_path, capsys, other):
    """--expected writes only the data file: a --json or --compare beside it would be silently ignored."""
    (tmp_path / "plans.json").write_text("{}")
    with pytest.raises(SystemExit) as e:
        main(["--expected", other[0], str(tmp_path / other[1])])
    assert e.value.code == 2
    assert "--expected" in capsys.readouterr().err
