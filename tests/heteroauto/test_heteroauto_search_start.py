"""The search's first incumbent (issue 30): every bound pass after it prunes against it, so a poor one makes
the search bound combinations that a good one would have cut.

The start splits, before any best-first step, the combination with the least order-free bound and each
other dp's most promising combination where its pipeline is short enough to split cheaply. Its plan is
checked against an independent one-line rule, the FLOPs-proportional split (baselines.flops_split: every
chip at its largest TP size, layers in proportion to FLOPs), priced by the same objective, on the paper's
experiments with the calibrated efficiencies (docs/heteroauto-bench.json): the start's plan must be no
slower. Taking only the least order-free bound's dp started Exp-A-1 at dp 2, 38.1 s (the rule: 30.0 s),
and Exp-C-1 at dp 2, 36.8 s (the rule: 24.2 s). The rule is not always beaten by the start (Exp-B-1 and
HARP, whose optima the best-first phase finds after it), so these are the experiments where it is.

The search's work budget is set to one unit, so the best-first phase stops right after the start and the
result is the start's incumbent (with per-stage data parallelism, which only lowers it)."""
from __future__ import annotations

import json

import pytest

from bench.heteroauto_plan_check import CALIBRATED
from bench.heteroauto_search import EXPERIMENTS, problem
from heteropp.auto.baselines import flops_split
from heteropp.auto.limits import Limits
from heteropp.auto.search import search_auto


@pytest.mark.parametrize("exp", ["Exp-A-1", "Exp-A-2", "Exp-C-1", "Exp-C-2", "Exp-D"])
def test_start_incumbent_no_slower_than_flops_split(exp: str) -> None:
    cm = problem(*EXPERIMENTS[exp], json.loads(CALIBRATED.read_text())["efficiency"])
    rule = min(c.time_s for c in flops_split(cm))
    first = search_auto(cm, rerank=False, idle="never", limits=Limits(work=1))
    assert first.bounded, "the one-unit budget should stop the search right after its start"
    assert first.best.time_s <= rule, (f"{exp}: the start's plan {first.best.label} at {first.best.time_s:.3f} s "
                                       f"is slower than the FLOPs-proportional split's {rule:.3f} s")
