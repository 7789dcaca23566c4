"""The cost model's 1F1B estimate against the simulator on slow links. Under 1F1B stage k sends its next
forward only after a backward returns, so a run of stages k..k' with n_k - n_k' + 1 micro-batches in flight
takes, per that many micro-batches, the sum of its stages' compute plus each boundary's round trip; on
HARP's 5 Gbps link that cycle, not the link's bandwidth, sets the pace (the simulator, an independent
event-driven model of the same action lists, shows it)."""
from __future__ import annotations

import random
from pathlib import Path

import pytest

from heteropp.auto.accuracy import ESTIMATE_BOUNDS
from heteropp.auto.costs import StageSpec, micro_batches
from heteropp.auto.plan_sim import simulate_stages
from heteropp.auto.planning import load_problem, run_search, to_plan

EX = Path(__file__).resolve().parents[2] / "examples"


def harp():
    return load_problem(
        str(EX / "clusters/harp.yaml"), str(EX / "models/gpt-harp.yaml"), str(EX / "training/harp.yaml")
    )


def test_harp_plan_estimate_within_5_percent_of_the_simulator():
    pb = harp()
    res = run_search(pb, progress=None)
    plan = to_plan(pb, res.best, None, "auto", res)
    assert plan.extra["model_estimate_s"] == pytest.approx(plan.iteration_time_s, rel=0.05)


def random_split(rng: random.Random, layers: int, p: int) -> list[int]:
    ls = [1] * p
    for _ in range(layers - p):
        ls[rng.randrange(p)] += 1
    return ls


@pytest.mark.parametrize("seed", range(10))
def test_random_harp_plans_estimate_within_5_percent(seed):
    pb = harp()
    rng = random.Random(seed)
    p = rng.choice([2, 4, 6, 8])
    na = rng.randint(1, p - 1)
    seq = ["A100"] * na + ["V100e"] * (p - na)
    tps = {c: min(8, 1 << ((32 // n).bit_length() - 1)) for c, n in (("A100", na), ("V100e", p - na))}
    stages = [StageSpec(c, tps[c], nl, False) for c, nl in zip(seq, random_split(rng, 24, p))]
    b = micro_batches(pb.train, 1)
    est = pb.cm.evaluate(stages, 1, b, round_trips=True).iteration_time_s
    sim = simulate_stages(pb.cm, stages, 1).iteration_time_s
    assert est == pytest.approx(sim, rel=0.05), (stages, est, sim)
    # the search's objective leaves the round trips out: it bounds the estimate from below
    assert pb.cm.evaluate(stages, 1, b).iteration_time_s <= est


@pytest.mark.parametrize("exp,gbs", [("a", "2m"), ("b", "8m"), ("c", "4m"), ("d", "8m")])
def test_paper_experiment_plans_estimate_within_5_percent(exp, gbs):
    pb = load_problem(str(EX / f"clusters/exp-{exp}.yaml"), "h2-100b", str(EX / f"training/gbs-{gbs}.yaml"))
    res = run_search(pb, progress=None)
    plan = to_plan(pb, res.best, None, "auto", res)
    assert plan.extra["model_estimate_s"] == pytest.approx(plan.iteration_time_s, rel=0.05)


# Estimate / simulated time over random HARP plans (slow 5 Gbps cross link), per schedule: the estimate is
# never more than UNDER below the simulator and at most OVER above it. GPipe's passes are flow shops of
# identical jobs, so its estimate is exact up to the update term. The alternating schedules' estimate is a
# longest chain of the actions as they run (alternating.py), warm-up and drain counted at their length: it
# overshoots only by the update term (before, with the steady-state term and (b - 1) / d round trips, 1F1B
# and ZB-H1 overshot by up to 18.8% and 25.6% at 2-8 micro-batches).
BOUNDS = ESTIMATE_BOUNDS  # the planner's stated error (heteropp/auto/accuracy.py)


@pytest.mark.parametrize("schedule", sorted(set(BOUNDS) - {"interleaved"}))
@pytest.mark.parametrize("few", [True, False], ids=["2-8 micro-batches", "16-64 micro-batches"])
def test_estimate_brackets_the_simulator_across_schedules_and_micro_batch_counts(schedule, few):
    import dataclasses

    from heteropp.auto.plan_sim import schedule_params
    pb = harp()
    under, over = BOUNDS[schedule][0 if few else 1]
    rng = random.Random(1)
    worst = [0.0, 0.0]
    for _ in range(12):
        p = rng.choice([2, 3, 4, 6])
        na = rng.randint(1, p - 1)
        seq = ["A100"] * na + ["V100e"] * (p - na)
        tps = {c: min(8, 1 << ((32 // n).bit_length() - 1)) for c, n in (("A100", na), ("V100e", p - na))}
        stages = [StageSpec(c, tps[c], nl, False) for c, nl in zip(seq, random_split(rng, 24, p))]
        for b in ([2, 3, 4, 6, 8] if few else [16, 32, 64]):
            pb.cm.train = dataclasses.replace(pb.cm.train, global_batch=b * pb.cm.train.micro_batch_size,
                                              schedule=schedule)
            params = schedule_params(pb.cm, stages, 1, schedule)
            est = pb.cm.evaluate(stages, 1, b, schedule, round_trips=True, params=params).iteration_time_s
            sim = simulate_stages(pb.cm, stages, 1, schedule, params=params).iteration_time_s
            worst = [min(worst[0], est / sim - 1), max(worst[1], est / sim - 1)]
            assert -under <= est / sim - 1 <= over, (schedule, b, stages, est, sim)
    assert worst[0] < 0 or worst[1] > 0  # the plans are not all trivially exact


def test_estimate_benchmark_reports_every_schedule_and_range():
    """Smoke run of bench/heteroauto_estimate.py (docs/benchmarks.md's table): every schedule and range,
    worst errors on either side of zero and inside this file's BOUNDS."""
    from bench.heteroauto_estimate import RANGES, SCHEDULES, measure
    got = measure(plans=3, seed=0)
    assert set(got) == {f"{s} {r}" for s in SCHEDULES for r in RANGES}
    for key, v in got.items():
        sched, label = key.split()
        under, over = BOUNDS[sched][0 if label == "2-8" else 1]
        assert -under <= v["under"] <= 0 <= v["over"] <= over, (key, v)


@pytest.mark.parametrize("few", [True, False], ids=["2-8 micro-batches", "16-64 micro-batches"])
def test_interleaved_estimate_counts_every_chunk_crossing_the_link(few):
    """Two chunks per stage: a micro-batch crosses the slow link twice each way and the wrap-around from
    the last stage to the first once; the estimate (on the physical stages) against the simulator running
    the virtual stages, within BOUNDS["interleaved"] (it was 60% low when it priced one crossing)."""
    import dataclasses

    from heteropp.auto.planning import virtual_stages
    from bench.heteroauto_estimate import random_plan
    pb, rng = harp(), random.Random(2)
    under, over = BOUNDS["interleaved"][0 if few else 1]
    measured = 0
    while measured < 8:
        stages = random_plan(rng, 24)
        p = len(stages)
        if any(s.layers < 2 for s in stages):
            continue
        for b in ([2, 4, 8] if few else [16, 64]):
            b = max(b // p, 1) * p
            pb.cm.train = dataclasses.replace(pb.cm.train, global_batch=b, schedule="interleaved")
            est = pb.cm.evaluate(stages, 1, b, "interleaved", round_trips=True, params={"chunks": 2}).iteration_time_s
            sim = simulate_stages(pb.cm, virtual_stages(stages, 2), 1, "interleaved",
                                  params={"chunks": 2}).iteration_time_s
            assert -under <= est / sim - 1 <= over, (b, stages, est, sim)
        measured += 1


@pytest.mark.parametrize("layers,b", [((3, 4, 4, 5, 5, 3), 16), ((6, 5, 6, 7), 8), ((10, 6, 8), 6),
                                      ((4, 9, 8, 3), 6), ((4, 9, 8, 3), 16), ((6, 6, 4, 4, 1, 3), 8)])
def test_1f1b_cycles_over_the_slow_link_then_the_later_stages_pace(layers, b):
    """One A100 stage, then V100e stages behind the 5 Gbps link: stage 0's round trips across the link
    set the pace until its last forward leaves, and the V100e stages' own alternation and drain set it
    after (alternating's chains that leave a cycle for a later stage), their drain's gradients queueing on
    the link on the way down. The estimate was 5.9%, 3.8% and 3.5% low with one pace, then 2.7% and 1.2%
    (the next two) with one hop per boundary on the way down, then 1.4% (the last: stage 1's last forward
    comes back from stage 3 as backward b - 3, and stage 1's own two backwards follow) with the drain's
    wait priced as its own backwards or the whole round trip only; it must stay within the stated error."""
    import dataclasses

    pb = harp()
    tp_v = min(8, 1 << ((32 // (len(layers) - 1)).bit_length() - 1))
    stages = [StageSpec("A100", 8, layers[0], False)] + [StageSpec("V100e", tp_v, n, False) for n in layers[1:]]
    pb.cm.train = dataclasses.replace(pb.cm.train, global_batch=b * pb.cm.train.micro_batch_size, schedule="1f1b")
    under, over = BOUNDS["1f1b"][0 if b <= 8 else 1]
    est = pb.cm.evaluate(stages, 1, b, "1f1b", round_trips=True).iteration_time_s
    sim = simulate_stages(pb.cm, stages, 1, "1f1b").iteration_time_s
    assert -under <= est / sim - 1 <= over, (est, sim)


def test_interleaved_slow_link_warm_up_queue_then_the_round_trip_beyond_it():
    """Two chunks, A100 x2 layers then five V100e stages, 6 micro-batches: every forward crossing of the
    slow link precedes its first backward one (stage 1's warm-up covers all 12 micro-steps), and between
    them the last forward runs on to stage 2, whose first backward comes back. The link term left that
    round trip out and was 6.8% low."""
    import dataclasses

    from heteropp.auto.planning import virtual_stages
    pb, b = harp(), 6
    stages = [StageSpec("A100", 8, 2, False)] + [StageSpec("V100e", 4, n, False) for n in (6, 6, 4, 4, 2)]
    pb.cm.train = dataclasses.replace(pb.cm.train, global_batch=b, schedule="interleaved")
    under, over = BOUNDS["interleaved"][0]
    est = pb.cm.evaluate(stages, 1, b, "interleaved", round_trips=True, params={"chunks": 2}).iteration_time_s
    sim = simulate_stages(pb.cm, virtual_stages(stages, 2), 1, "interleaved", params={"chunks": 2}).iteration_time_s
    assert -under <= est / sim - 1 <= over, (est, sim)


@pytest.mark.parametrize("stages,b", [
    ((("A100", 8, 7), ("A100", 8, 7), ("V100e", 8, 10)), 3),
    ((("A100", 8, 7), ("A100", 8, 3), ("V100e", 8, 14)), 3),
    ((("A100", 8, 5), ("V100e", 8, 11), ("V100e", 8, 8)), 15),
    ((("A100", 8, 13), ("V100e", 8, 11)), 6),
    ((("A100", 8, 9), ("V100e", 8, 15)), 16),
    ((("A100", 8, 6),) + tuple(("V100e", 4, n) for n in (4, 3, 2, 4, 5)), 60),
    ((("A100", 8, 4),) + tuple(("V100e", 4, n) for n in (3, 4, 4, 2, 7)), 60),
])
def test_interleaved_estimate_is_the_chains_with_each_links_queue(stages, b):
    """Two chunks per stage on HARP's 5 Gbps link, the plans the closed-form terms missed most: +11.5% and
    +13.7% at 3 micro-batches (a link's steady state charged next to a whole fill), -6.2%, -6.0%, -6.8% and
    -8.9% with the forward and backward crossings of the slow link and of the wrap-around link back to the
    A100 stage queueing behind each other. The estimate is now a longest chain of the actions the
    simulator runs (auto/chains.py): never above the simulator, and within the stated error below it."""
    import dataclasses

    from heteropp.auto.planning import virtual_stages
    pb = harp()
    specs = [StageSpec(c, tp, n, False) for c, tp, n in stages]
    pb.cm.train = dataclasses.replace(pb.cm.train, global_batch=b, schedule="interleaved")
    under, over = BOUNDS["interleaved"][0 if b <= 8 else 1]
    est = pb.cm.evaluate(specs, 1, b, "interleaved", round_trips=True, params={"chunks": 2}).iteration_time_s
    sim = simulate_stages(pb.cm, virtual_stages(specs, 2), 1, "interleaved", params={"chunks": 2}).iteration_time_s
    assert est == pytest.approx(sim, rel=0.05) and est <= sim, (est, sim)
    assert -under <= est / sim - 1 <= over <= 0.0, (est, sim)


@pytest.mark.parametrize("b", [2, 3])
def test_gpipe_update_of_a_stage_that_ends_long_before_stage_0(b):
    """GPipe, three A100 stages (3, 10, 6 layers) then a V100e stage behind the 5 Gbps link: stage 1 has
    the largest update, and its last backward ends long before stage 0's (the drain's gradients queue on
    the link first). The update term charged stage 1's update after stage 0's end less one layer's
    backward and hop per stage (drain_gaps): 1.3% and 1.0% high, over GPipe's stated 1%. Each stage's
    update now follows its own last backward, from the flow shops of the whole passes, exact under GPipe."""
    import dataclasses

    pb = harp()
    stages = [StageSpec("A100", 8, n, False) for n in (3, 10, 6)] + [StageSpec("V100e", 8, 5, False)]
    pb.cm.train = dataclasses.replace(pb.cm.train, global_batch=b * pb.cm.train.micro_batch_size, schedule="gpipe")
    under, over = BOUNDS["gpipe"][0]
    est = pb.cm.evaluate(stages, 1, b, "gpipe", round_trips=True).iteration_time_s
    sim = simulate_stages(pb.cm, stages, 1, "gpipe").iteration_time_s
    assert -under <= est / sim - 1 <= over, (est, sim)


@pytest.mark.parametrize("schedule", ["1f1b", "h1f1b"])
def test_alternating_update_of_a_stage_that_ends_long_before_stage_0(schedule):
    """Three A100 stages (2, 6, 12 layers) then a V100e stage behind the 5 Gbps link, 2 micro-batches:
    stage 2 has the largest update and ends long before stage 0. Charging it after stage 0's end less
    drain_gaps made the estimate 2.2% high under both schedules (over the stated 2%); each stage's update
    now follows its own last backward (alternating.last_backward_ends, a lower bound)."""
    import dataclasses

    from heteropp.auto.plan_sim import schedule_params
    pb, b = harp(), 2
    stages = [StageSpec("A100", 8, n, False) for n in (2, 6, 12)] + [StageSpec("V100e", 8, 4, False)]
    pb.cm.train = dataclasses.replace(pb.cm.train, global_batch=b * pb.cm.train.micro_batch_size, schedule=schedule)
    params = schedule_params(pb.cm, stages, 1, schedule)
    under, over = BOUNDS[schedule][0]
    est = pb.cm.evaluate(stages, 1, b, schedule, round_trips=True, params=params).iteration_time_s
    sim = simulate_stages(pb.cm, stages, 1, schedule, params=params).iteration_time_s
    assert est <= sim * (1 + 1e-12) and -under <= est / sim - 1 <= over, (est, sim)


@pytest.mark.parametrize("layers,b", [((6, 7, 5, 6), 16), ((4, 9, 8, 3), 6)])
def test_h1f1b_drain_queues_on_the_slow_link(layers, b):
    """H-1F1B, one A100 stage then V100e stages: the last V100e stage's own alternation sets the pace, and
    the drain's gradients then queue on the slow link (a V100e stage's backward is shorter than a transfer
    across it), which the gradient's way down as one hop per boundary left out: the estimate was 4.1% and
    3.0% low; it must stay within the stated error."""
    import dataclasses

    from heteropp.auto.plan_sim import schedule_params
    pb = harp()
    tp_v = min(8, 1 << ((32 // (len(layers) - 1)).bit_length() - 1))
    stages = [StageSpec("A100", 8, layers[0], False)] + [StageSpec("V100e", tp_v, n, False) for n in layers[1:]]
    pb.cm.train = dataclasses.replace(pb.cm.train, global_batch=b * pb.cm.train.micro_batch_size, schedule="h1f1b")
    params = schedule_params(pb.cm, stages, 1, "h1f1b")
    assert any(params["extra_warmup"])  # the slow link gets extra warm-up
    under, over = BOUNDS["h1f1b"][0 if b <= 8 else 1]
    est = pb.cm.evaluate(stages, 1, b, "h1f1b", round_trips=True, params=params).iteration_time_s
    sim = simulate_stages(pb.cm, stages, 1, "h1f1b", params=params).iteration_time_s
    assert -under <= est / sim - 1 <= over, (est, sim)


@pytest.mark.parametrize("b", [8, 16])
def test_zbh1_last_stage_after_a_round_trip_below_it(b):
    """ZB-H1, two A100 stages then one V100e stage behind the 5 Gbps link: the V100e stage's first
    backward's gradient goes down to stage 1, whose next forward comes back across the link, and from
    then on the V100e stage's own forwards, input gradients and weight passes run back to back, then its
    update. The chain leaving stage 1's cycle for a stage inside the cycle's run was missing: 3.3% and
    2.1% low; it must stay within the stated error."""
    import dataclasses

    pb = harp()
    stages = [StageSpec("A100", 8, 6, False), StageSpec("A100", 8, 6, False), StageSpec("V100e", 8, 12, False)]
    pb.cm.train = dataclasses.replace(pb.cm.train, global_batch=b * pb.cm.train.micro_batch_size, schedule="zbh1")
    under, over = BOUNDS["zbh1"][0 if b <= 8 else 1]
    est = pb.cm.evaluate(stages, 1, b, "zbh1", round_trips=True).iteration_time_s
    sim = simulate_stages(pb.cm, stages, 1, "zbh1").iteration_time_s
    assert -under <= est / sim - 1 <= over, (est, sim)


@pytest.mark.parametrize("layers", [(2, 6, 6, 4, 4, 2), (2, 6, 2, 3, 8, 3)])
def test_zbh1_weight_passes_a_stage_holds_back_cover_no_wait(layers):
    """ZB-H1 at 4 micro-batches, one A100 stage then five V100e stages: a stage's held-back weight passes
    run only after its last input gradient, so they cover none of its wait for forward b - 1's round trip
    (stage_ends counted a weight pass with every drain backward), and the weight passes a stage runs
    between its drain backwards count on the flow shop down to it (pass_last_backward). The estimate was
    2.1% and 2.4% low; it must stay within the stated error."""
    import dataclasses

    pb, b = harp(), 4
    stages = [StageSpec("A100", 8, layers[0], False)] + [StageSpec("V100e", 4, n, False) for n in layers[1:]]
    pb.cm.train = dataclasses.replace(pb.cm.train, global_batch=b * pb.cm.train.micro_batch_size, schedule="zbh1")
    under, over = BOUNDS["zbh1"][0]
    est = pb.cm.evaluate(stages, 1, b, "zbh1", round_trips=True).iteration_time_s
    sim = simulate_stages(pb.cm, stages, 1, "zbh1").iteration_time_s
    assert -under <= est / sim - 1 <= over, (est, sim)


def test_zbh1_stage_waiting_for_gradients_runs_its_held_weight_passes_after_them():
    """ZB-H1 at 4 micro-batches on a small three-type instance (bench.heteroauto_vs_brute's seed 0,
    instance 8): stage 1 holds one weight pass back, so while it waits for stage 2's second gradient it
    idles instead of running weight pass 0, and every weight pass then follows that late gradient. The chain
    through stage 2's backward 1, its hop and stage 1's remaining backwards and weight passes
    (alternating.backward_ends) was missing: the estimate was 27.22 s against 29.22 s simulated (-6.8%).
    The simulator's time is the reference; the estimate must stay a lower bound within the stated error."""
    from bench.heteroauto_vs_brute import random_problem

    rng = random.Random(0)
    for _ in range(9):
        pb = random_problem(rng, "zbh1")
    stages = [StageSpec(c, 1, n, False) for c, n in (("Y", 1), ("X", 2), ("X", 2), ("Z", 1), ("Z", 1))]
    under, over = BOUNDS["zbh1"][0]
    est = pb.cm.evaluate(stages, 1, 4, "zbh1", round_trips=True).iteration_time_s
    sim = simulate_stages(pb.cm, stages, 1, "zbh1").iteration_time_s
    assert -under <= est / sim - 1 <= over, (est, sim)


@pytest.mark.parametrize("schedule", ["1f1b", "zbh1", "h1f1b"])
def test_alternating_estimate_brackets_the_simulator_on_every_small_three_type_plan(schedule):
    """Every plan of one-chip stages (every dp, order of types and layer split) of ten random three-type
    instances (bench.heteroauto_vs_brute's seed 0, 4 to 8 micro-batches, slow links): the estimate is a
    lower bound of the simulator's time within the stated error (ZB-H1 was 6.8% low on one)."""
    import itertools

    from bench.heteroauto_vs_brute import random_problem
    from heteropp.auto.plan_sim import schedule_params
    from heteropp.auto.reference import compositions
    from heteropp.auto.space import dp_candidates

    rng, worst = random.Random(0), []
    for i in range(10):
        cm = random_problem(rng, schedule).cm
        counts = {c.name: c.count for c in cm.cluster.chips}
        for dp in dp_candidates(cm.cluster, cm.train):
            b = micro_batches(cm.train, dp)
            under, over = BOUNDS[schedule][0]
            for order in itertools.permutations(counts):
                seq = [c for c in order for _ in range(counts[c] // dp)]
                for split in compositions(cm.model.layers, len(seq)) if len(seq) <= cm.model.layers else ():
                    stages = [StageSpec(c, 1, n, False) for c, n in zip(seq, split)]
                    q = schedule_params(cm, stages, dp, schedule)
                    est = cm.evaluate(stages, dp, b, schedule, round_trips=True, params=q).iteration_time_s
                    sim = simulate_stages(cm, stages, dp, schedule, params=q).iteration_time_s
                    if not -under <= est / sim - 1 <= over:
                        worst.append((est / sim - 1, i, dp, split))
    assert not worst, worst[:5]
