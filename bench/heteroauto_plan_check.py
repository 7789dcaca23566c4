"""The plans `heteroauto plan` writes for a fixed set of problems, for checking that a change meant to make
the planner faster leaves every plan as it was: the H2 paper experiments and HARP (as specified, and with
the calibrated chip efficiencies of docs/heteroauto-bench.json) and 24 random small instances of
bench.heteroauto_vs_brute (1F1B, H-1F1B, interleaved and ZB-H1, seed 5). Each plan is written whole but its
search time, with its runners-up, and the work and CPU time it took (informative: work may change when the
plans do not).

    python -m bench.heteroauto_plan_check --json before.json      # on the code before the change
    python -m bench.heteroauto_plan_check --compare before.json   # after: exit 1 naming what differs

`--expected` writes the plans of TEST_PROBLEMS, a subset planned in a few seconds, without work and CPU times, to
EXPECTED: tests/heteroauto/test_heteroauto_plan_guard.py plans them again under `make test` and compares.
Regenerate it only for a change meant to alter plans (and say which plans changed, and why, in its commit).
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Iterable

from bench.heteroauto_search import EXPERIMENTS, cm_problem, problem
from bench.heteroauto_vs_brute import random_problem
from heteropp.auto.front_door import plan
from heteropp.auto.planning import Problem
from heteropp.spec import InfeasibleError

CALIBRATED = Path(__file__).resolve().parents[1] / "docs" / "heteroauto-bench.json"
RANDOM_SCHEDULES = ("1f1b", "h1f1b", "interleaved", "zbh1")
RANDOM_SEED, RANDOM_INSTANCES = 5, 6
EXPECTED = Path(__file__).resolve().parents[1] / "tests" / "heteroauto" / "data" / "plan_check_expected.json"
# the problems the test plans: every random instance, and one each of the paper's clusters and HARP that plan
# in well under a second (Exp-D and the uncalibrated Exp-B take about one each)
TEST_PROBLEMS = ("Exp-A-1", "Exp-A-2-calibrated", "Exp-B-2-calibrated", "Exp-C-1-calibrated", "HARP-calibrated",
                 *(f"random-{s}-{i}" for s in RANDOM_SCHEDULES for i in range(RANDOM_INSTANCES)))


def problems(names: Iterable[str] | None = None) -> dict[str, Problem]:
    """The problems by name (`names`: only these; a random instance's generator runs up to it)."""
    want = None if names is None else set(names)
    eff = json.loads(CALIBRATED.read_text()).get("efficiency") if CALIBRATED.exists() else None
    out = {}
    for tag, e in (("", None), ("-calibrated", eff)):
        if tag and not e:
            continue
        for name, (c, m, t) in EXPERIMENTS.items():
            if want is None or name + tag in want:
                out[name + tag] = cm_problem(problem(c, m, t, e))
    for sched in RANDOM_SCHEDULES:
        rng = random.Random(RANDOM_SEED)
        for i in range(RANDOM_INSTANCES):
            pb = random_problem(rng, sched)
            if want is None or f"random-{sched}-{i}" in want:
                out[f"random-{sched}-{i}"] = pb
    if want is not None and want - out.keys():
        raise ValueError(f"unknown problems {sorted(want - out.keys())}; expected some of {sorted(problems())}")
    return out


def planned(pb: Problem, informative: bool = True) -> dict:
    """The plan and its runners-up; `informative`: with the work and CPU time it took (they may change when
    the plans do not)."""
    try:
        r = plan(pb)
    except InfeasibleError as e:
        return {"infeasible": str(e)}
    d = r.plan.to_dict()
    d.pop("search_time_s", None)
    out = {"plan": d, "runners_up": [[c.label, c.time_s] for c in r.search.runners_up]}
    return {**out, "work": r.search.work, "cpu_s": r.cpu_time_s} if informative else out


def differences(old: dict, new: dict) -> list[str]:
    """The problems whose plan or runners-up differ (work and CPU time are not compared)."""
    keys = ("plan", "runners_up", "infeasible")
    return [k for k in sorted(set(old) | set(new))
            if {x: old.get(k, {}).get(x) for x in keys} != {x: new.get(k, {}).get(x) for x in keys}]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="write the plans here")
    ap.add_argument("--compare", help="plans written before: exit 1 when any differs")
    ap.add_argument("--expected", action="store_true",
                    help="write the plans of TEST_PROBLEMS, without work and CPU times, to tests/heteroauto/data/")
    a = ap.parse_args(argv)
    if a.expected and (a.json or a.compare):  # it writes only the test's data file
        ap.error("--expected writes only tests/heteroauto/data/; expected it alone, without --json or --compare")
    if a.compare and not Path(a.compare).is_file():
        ap.error(f"--compare {a.compare}: no such file; expected the --json output of an earlier run")
    if a.expected:
        every = problems(TEST_PROBLEMS)
        EXPECTED.parent.mkdir(exist_ok=True)
        EXPECTED.write_text(json.dumps({n: planned(every[n], informative=False) for n in TEST_PROBLEMS}, indent=1,
                                       sort_keys=True) + "\n")
        print(f"{len(TEST_PROBLEMS)} problems written to {EXPECTED.name}")
        return 0
    out = {name: planned(pb) for name, pb in problems().items()}
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    if a.compare:
        diff = differences(json.loads(Path(a.compare).read_text()), out)
        print(f"{len(out)} problems, {len(diff)} with another plan or runners-up" + (": " + ", ".join(diff) if diff
                                                                                      else ""))
        return 1 if diff else 0
    print(f"{len(out)} problems planned")
    return 0


if __name__ == "__main__":
    sys.exit(main())
