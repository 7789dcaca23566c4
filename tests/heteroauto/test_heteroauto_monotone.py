"""More chips never give a slower plan, and fewer never give a plan slower than the larger cluster's
plan where that plan still fits (issue 30: 10,240 chips of 6 types planned at 3.4 s, one chip fewer or
eight more at 9.0 s with 60% of the chips, although the 10,240-chip plan was valid there). Each cluster
is planned at N - 1, N, N + 1 and N + 8 chips of its first type; times are the plans' simulated ones. The
last two clusters' N is no round number: 19 H200 planned at 28.3 s where 18 planned at 24.0 s, and 108
chips of type A slower than 100 (14.87 s against 14.57 s), before counts were rounded down to every power
of two (baselines.ROUNDINGS). Since gradients are priced at the bytes the engine sends, 100 + 36 + 20 chips
planned at 14.954 s where 99 + 36 + 20 planned at 14.594 s with the same chips (an idle-chip plan at dp 2
that the search's objective put 4.8% above its simulated time), until the planner and its rounded counts
offered the idle-chip plans to the ranking on clusters of up to planning.IDLE_OFFER_CHIPS chips."""
from __future__ import annotations

import itertools

import pytest

from bench.heteroauto_scenarios import H200, slow_links
from bench.heteroauto_search import SCALE_TYPES, scale_cluster
from heteropp.auto.analytic import analytic_profile
from heteropp.auto.costs import CostModel
from heteropp.auto.planning import Problem, run_search, to_plan
from heteropp.spec import TrainSpec, cluster_from_dict, load_model
CLUSTERS = {
    "3 types, 10 Gbps / 2 ms links": slow_links([64, 32, 32]),
    "H200 and 2 others": scale_cluster([64, 32, 16], types=[H200, *SCALE_TYPES[:2]]),
    "19 H200 and 12 others": scale_cluster([19, 12], types=[H200, SCALE_TYPES[3]]),
    "100, 36 and 20 of 3 types": scale_cluster([100, 36, 20]),
}


def _planned(spec: dict, first: int) -> tuple[float, dict[str, int]]:
    spec = {**spec, "chips": [{**spec["chips"][0], "count": first}, *spec["chips"][1:]]}
    cl = cluster_from_dict(spec, "test")
    m = load_model("h2-100b")
    tr = TrainSpec(global_batch=64)  # few micro-batches: each plan simulates quickly
    pb = Problem(cl, m, tr, CostModel(cl, m, tr, analytic_profile(cl, m, tr)))
    plan = to_plan(pb, run_search(pb).best, None, "auto")
    return plan.iteration_time_s, plan.chips_used()


@pytest.mark.parametrize("name", list(CLUSTERS))
def test_more_chips_never_plan_slower_and_fewer_no_slower_than_a_plan_that_still_fits(name):
    spec = CLUSTERS[name]
    n = spec["chips"][0]["count"]
    first = spec["chips"][0]["name"]
    t = {k: _planned(spec, n + k) for k in (-1, 0, 1, 8)}
    base, used = t[0]
    for fewer, more in ((-1, 0), (0, 1), (0, 8)):
        a, b = t[fewer][0], t[more][0]
        assert b <= a * (1 + 1e-9), f"{n + more} chips: {b:.4f} s, {n + fewer} chips: {a:.4f} s"
    if used.get(first, 0) <= n - 1:  # the N-chip plan leaves one idle: it runs on N - 1 chips
        assert t[-1][0] <= base * (1 + 1e-9), f"{n - 1} chips: {t[-1][0]:.4f} s, {n} chips: {base:.4f} s"


# (types, counts, links GB/s, global batch): clusters that plan with every chip, where one chip more of the
# second type raised "no plan fits". 64 + 25: the search's every split failed (a stage's memory) and it
# raised instead of leaving a chip idle; 24 + 13: the idle-chip search found nothing either, and the error
# kept the baselines (24 + 12, a rounded count) from being planned.
ONE_MORE = {
    "64 + 25": ([SCALE_TYPES[3], SCALE_TYPES[2]], [64, 24], [1.25, 10], 32),
    "24 + 13": ([SCALE_TYPES[4], SCALE_TYPES[2]], [24, 12], [2.5, 1.25], 32),
}


@pytest.mark.parametrize("name", list(ONE_MORE))
def test_a_chip_more_never_makes_a_cluster_that_planned_infeasible(name):
    types, counts, links, batch = ONE_MORE[name]
    spec = scale_cluster(counts, types=types)
    for chip, bw in zip(spec["chips"], links):
        chip["network_bw"] = bw

    def planned(second: int) -> tuple[float, dict[str, int]]:
        cl = cluster_from_dict({**spec, "chips": [spec["chips"][0], {**spec["chips"][1], "count": second}]}, "test")
        m, tr = load_model("h2-100b"), TrainSpec(global_batch=batch)
        pb = Problem(cl, m, tr, CostModel(cl, m, tr, analytic_profile(cl, m, tr)))
        plan = to_plan(pb, run_search(pb).best, None, "auto")
        return plan.iteration_time_s, plan.chips_used()

    n = counts[1]
    (t0, used0), (t1, used1) = planned(n), planned(n + 1)
    assert used0 == {"A": counts[0], "B": n}
    assert t1 <= t0 * (1 + 1e-9) and sum(used1.values()) <= sum(counts), (t1, used1)


# (types, counts, links GB/s, global batch, the type grown, by how many): clusters where more chips planned
# slower (0.3-9%, found by a random probe) while rounded_counts rounded every type by the same power of two:
# 65 + 25 chips plan best on 64 + 24, which 73 + 25 reaches only with one type's count rounded by 64 and the
# other's by 8
MIXED = {
    "73 + 25": ([SCALE_TYPES[0], H200], [65, 25], [2.5, 2.5], 64, 0, 8),
    "15 + 36": ([SCALE_TYPES[0], SCALE_TYPES[1]], [15, 35], [10, 10], 32, 1, 1),
    "61 + 24": ([SCALE_TYPES[2], H200], [53, 24], [1.25, 1.25], 128, 0, 8),
    # every chip serves at 48 + 24 + 64; with a node more of the slow second type, its plan (a node idle) is
    # a sub-cluster no power of two rounds to
    "48 + 32 + 64": ([SCALE_TYPES[3], SCALE_TYPES[6], SCALE_TYPES[4]], [48, 24, 64], [10, 10, 10], 64, 1, 8),
    # 9 + 64 + 65 plans on 8 + 64 + 64 (9.283 s); 17 + 64 + 65 planned on 16 + 64 + 64 (9.338 s): 8 is a node
    # less than 16, which neither a rounding of 17 nor a node less than 17 reaches (the descent does)
    "17 + 64 + 65": ([SCALE_TYPES[1], H200, H200], [9, 64, 65], [1.25, 2.5, 1.25], 128, 0, 8),
    # 24 + 51 + 51 plans on 8 + 48 + 48 (3.272 s); 32 + 51 + 51 planned on 0 + 48 + 48 (3.358 s), its first type
    # idle, from which no count less of any type reaches 8 + 48 + 48 (a node of the idle type added does)
    "32 + 51 + 51": ([SCALE_TYPES[5], H200, H200], [24, 51, 51], [10, 10, 10], 32, 0, 8),
    # 29 + 16 + 85 plans on 28 + 16 + 80 (12.026 s); 29 + 17 + 85 planned on 24 + 16 + 72 (13.181 s) while
    # mixed_rounded_counts took one type changed, then two, ...: 28 + 16 + 80 changes all three types of
    # 29 + 17 + 85 (two of 29 + 16 + 85) and fell beyond its first 24 (a random probe of 80 clusters)
    "29 + 17 + 85": ([H200, SCALE_TYPES[0], SCALE_TYPES[5]], [29, 16, 85], [2.5, 10, 2.5], 64, 1, 1),
}


# "32 + 51 + 51" plans two clusters of 126 and 134 chips (about 20 s): `make test-slow`
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n == "32 + 51 + 51" else n for n in MIXED])
def test_more_chips_of_one_type_plan_no_slower_when_the_best_rounds_types_differently(name):
    types, counts, links, batch, grown, more = MIXED[name]
    spec = scale_cluster(counts, types=types)
    for chip, bw in zip(spec["chips"], links):
        chip["network_bw"] = bw

    def planned(extra: int) -> float:
        chips = [{**c, "count": c["count"] + (extra if i == grown else 0)} for i, c in enumerate(spec["chips"])]
        cl = cluster_from_dict({**spec, "chips": chips}, "test")
        m, tr = load_model("h2-100b"), TrainSpec(global_batch=batch)
        pb = Problem(cl, m, tr, CostModel(cl, m, tr, analytic_profile(cl, m, tr)))
        return to_plan(pb, run_search(pb).best, None, "auto").iteration_time_s

    base, grown_t = planned(0), planned(more)
    assert grown_t <= base * (1 + 1e-9), f"{more} more chips: {grown_t:.4f} s, before: {base:.4f} s"


# (types, counts, links GB/s, global batch, the type shrunk): clusters whose plan leaves a chip of that type
# idle, where one chip fewer of it planned slower (found by a random probe): 101 + 13 + 15 plans on 96 + 0 + 12
# (17.397 s) and 100 + 13 + 15 planned on 100 + 8 + 12 (18.280 s), the descent's best start, whose every
# neighbour was slower; 96 + 0 + 12 is a neighbour of the second fastest plan, 100 + 0 + 12
FEWER = {
    "101 + 13 + 15": ([SCALE_TYPES[3], SCALE_TYPES[6], H200], [101, 13, 15], [2.5, 10, 2.5], 128, 0),
}


@pytest.mark.parametrize("name", list(FEWER))
def test_a_chip_fewer_plans_no_slower_than_the_plan_that_left_it_idle(name):
    types, counts, links, batch, shrunk = FEWER[name]
    spec = scale_cluster(counts, types=types)
    for chip, bw in zip(spec["chips"], links):
        chip["network_bw"] = bw

    def planned(less: int) -> tuple[float, dict[str, int]]:
        chips = [{**c, "count": c["count"] - (less if i == shrunk else 0)} for i, c in enumerate(spec["chips"])]
        cl = cluster_from_dict({**spec, "chips": chips}, "test")
        m, tr = load_model("h2-100b"), TrainSpec(global_batch=batch)
        pb = Problem(cl, m, tr, CostModel(cl, m, tr, analytic_profile(cl, m, tr)))
        plan = to_plan(pb, run_search(pb).best, None, "auto")
        return plan.iteration_time_s, plan.chips_used()

    (base, used), (fewer, _) = planned(0), planned(1)
    assert used.get(spec["chips"][shrunk]["name"], 0) <= counts[shrunk] - 1, used  # it still fits
    assert fewer <= base * (1 + 1e-9), f"a chip fewer: {fewer:.4f} s, before: {base:.4f} s"


def _brute_mixed(cl, limit: int) -> list[dict[str, int]]:
    """Every combination of each type's own count or its roundings (ROUNDINGS) or, up to FEWER_CHIPS chips, its
    count less one chip or one node, minus the cluster itself and the uniform roundings; the most chips first,
    then fewer types changed."""
    from heteropp.auto.baselines import FEWER_CHIPS, ROUNDINGS, rounded_counts

    per = [{c.count, *(c.count // 2 ** j * 2 ** j for j in ROUNDINGS if c.count >= 2 ** j),
            *(c.count - k for k in (1, c.chips_per_node) if c.count > k and cl.total_chips <= FEWER_CHIPS)}
           for c in cl.chips]
    whole = {c.name: c.count for c in cl.chips}
    every = [dict(zip(whole, combo)) for combo in itertools.product(*per)]
    every = [d for d in every if d != whole and d not in rounded_counts(cl)]
    every.sort(key=lambda d: (-sum(d.values()), sum(d[n] != whole[n] for n in whole)))
    return every[:limit]


@pytest.mark.parametrize("counts", [[73, 25], [17, 64, 65], [63, 61, 59, 57]])
def test_mixed_rounded_counts_are_the_first_of_every_combination_in_their_order(counts):
    # the sub-clusters come lazily, the most chips first, not from the whole product, which on 8 types of
    # about 60 chips holds 1.7 million of them (5.8 s of CPU before each plan)
    from heteropp.auto.baselines import MIXED_ROUNDINGS, mixed_rounded_counts

    cl = cluster_from_dict(scale_cluster(counts), "test")
    got = mixed_rounded_counts(cl)
    want = _brute_mixed(cl, MIXED_ROUNDINGS)
    def key(d: dict[str, int]) -> tuple[int, int]:
        return -sum(d.values()), sum(d[c.name] != c.count for c in cl.chips)

    # the same chip totals and numbers of types changed in order, and the same sub-clusters but for ties at the cut
    assert [key(d) for d in got] == [key(d) for d in want]
    last = key(want[-1])
    assert ({tuple(sorted(d.items())) for d in got if key(d) != last}
            == {tuple(sorted(d.items())) for d in want if key(d) != last})


def test_mixed_rounded_counts_of_eight_types_are_the_most_chips_of_the_product():
    # 8 types of 49-63 chips (1.7 million combinations): each type less one chip (8 sub-clusters of 447
    # chips), then 16 of the 28 pairs of types less one chip each (446 chips; a tie at the cut)
    from heteropp.auto.baselines import MIXED_ROUNDINGS, mixed_rounded_counts

    counts = [63, 61, 59, 57, 55, 53, 51, 49]
    cl = cluster_from_dict(scale_cluster(counts), "test")
    got = mixed_rounded_counts(cl)
    assert len(got) == MIXED_ROUNDINGS == 24
    less = [tuple(c.count - d[c.name] for c in cl.chips) for d in got]
    singles = [tuple(int(i == t) for i in range(8)) for t in range(8)]
    pairs = [tuple(int(i in (a, b)) for i in range(8)) for a, b in itertools.combinations(range(8), 2)]
    assert sorted(less[:8]) == sorted(singles) and set(less[8:]) <= set(pairs) and len(set(less[8:])) == 16
