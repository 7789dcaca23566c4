"""The larger plan space (issue 30 item 4): idle chips anywhere, any dp that divides the micro-batch count,
chip types interleaved along the pipeline. The reference is the brute force over that space
(brute_force(extended=True): every one-chip stage sequence, layer split and parameter value, each run by the
event-loop simulator), on the seeded small instances of bench/heteroauto_vs_brute.py with slow links and
tight memory (FAMILIES "tight"; "tight-small" for H-1F1B, whose warm-ups multiply the brute force's
options). Hand-set profiles stand in for measured chips; the simulator stands in for the cluster."""
from __future__ import annotations

import itertools
import random
from collections import Counter

import pytest

from bench.heteroauto_vs_brute import random_problem
from heteropp.auto.brute_force import brute_force
from heteropp.auto.extended import sequence_bound, sequences
from heteropp.auto.front_door import plan


def _instance(schedule: str, family: str, seed: int, index: int):
    rng = random.Random(seed)
    for _ in range(index + 1):
        pb = random_problem(rng, schedule, family)
    return pb


# (schedule, family, seed, index, how much slower the planner's plan was before the larger space; the brute
# force's plan). Seed 2's 25 instances had such a gap on 6 (1F1B, up to 11%), 6 (ZB-H1, up to 7%),
# 4 (interleaved 1F1B, up to 21%), 1 (GPipe) and 6 (H-1F1B, tight-small, up to 8%); these are the ones
# whose brute force runs in under a second.
CASES = [
    ("1f1b", "tight", 2, 15, 0.030),  # Y X Z (Z idle): one Z of two and one Y of two idle
    ("1f1b", "tight", 2, 17, 0.032),  # X Z Z Z Y: X's second chip idle
    ("1f1b", "tight", 2, 10, 0.003),  # Z Yr Y Y: an X and two Zs idle
    ("zbh1", "tight", 2, 17, 0.069),
    ("zbh1", "tight", 2, 12, 0.010),  # X X Y X Z Z: X on both sides of Y
    ("interleaved", "tight", 2, 6, 0.207),  # X Y Z Y: Y on both sides of Z
    ("interleaved", "tight", 2, 13, 0.188),
    ("gpipe", "tight", 2, 2, 0.002),
    ("h1f1b", "tight-small", 2, 15, 0.082),
    ("h1f1b", "tight-small", 2, 11, 0.049),  # Y Z X Y: Y on both ends
]


@pytest.mark.parametrize("schedule,family,seed,index,before", CASES)
def test_planner_reaches_the_brute_force_of_the_larger_space(schedule, family, seed, index, before):
    """The planner's plan simulates no slower than the best plan of the larger space; it is a valid plan for
    the cluster (its idle chips, interleaved types and dp included)."""
    pb = _instance(schedule, family, seed, index)
    got = plan(pb).plan
    best = brute_force(pb, extended=True)[0]
    assert got.iteration_time_s <= best * (1 + 1e-9), \
        f"{100 * (got.iteration_time_s / best - 1):.1f}% slower than the brute force (before: {100 * before:.1f}%)"
    got.validate(num_layers=pb.model.layers, available={c.name: c.count for c in pb.cluster.chips})


def test_the_larger_space_holds_the_contiguous_space():
    """Every plan of the contiguous brute force is in the larger one, so its optimum is no slower."""
    for i in range(4):
        pb = _instance("1f1b", "default", 0, i)
        assert brute_force(pb, extended=True)[0] <= brute_force(pb)[0]


def test_sequences_are_every_distinct_order_of_every_chip_multiset():
    """extended.sequences against the distinct permutations of every multiset of each type's usable chips
    (itertools), at every dp; the count bound is no less than the count."""
    pb = _instance("1f1b", "tight", 2, 4)
    counts = {c.name: c.count for c in pb.cluster.chips}
    for dp in (1, 2):
        want = set()
        for per in itertools.product(*(range(n // dp + 1) for n in counts.values())):
            pool = [n for n, k in zip(counts, per) for _ in range(k)]
            if 0 < len(pool) <= pb.model.layers:
                want |= set(itertools.permutations(pool))
        got = [tuple(c for c, _ in s) for s in sequences(pb.cm, dp)]
        assert Counter(got) == Counter(want)
        assert sequence_bound(pb.cm, dp) >= len(got)
