"""Per-stage data parallelism in the planner: the cost model prices a stage's inner_dp replicas as the
simulator runs them (each computes micro_batch_size / inner_dp of every micro-batch, gradients reduced over
dp x inner_dp, ZeRO-1 over those replicas), and the search proposes inner_dp > 1 where splitting rows beats
splitting layers' matmuls (TP here costs 10% extra), which the exact inner_dp = 1 reference search cannot
reach."""
from __future__ import annotations

import pytest

from heteroauto_helpers import chip, tp_entry
from heteropp.auto.costs import CostModel, StageSpec, micro_batches
from heteropp.auto.plan_sim import simulate_stages
from heteropp.auto.planning import Problem, to_plan
from heteropp.auto.profiles import ChipProfile, Profile
from heteropp.auto.reference import reference_search
from heteropp.auto.search import search_auto
from heteropp.spec import ModelSpec, TrainSpec, cluster_from_dict


def problem(mbs: int = 2, counts: tuple[int, int] = (4, 4)) -> CostModel:
    cl = cluster_from_dict({"name": "t", "chips": [chip("X", counts[0], 40.0), chip("Y", counts[1], 40.0)]}, "test")
    model = ModelSpec("m", layers=8, hidden=1024, heads=8, kv_heads=8, ffn=4096, vocab=1000, seq_len=128)
    train = TrainSpec(global_batch=16, micro_batch_size=mbs, dtype="bf16", zero1=True, schedule="1f1b")
    prof = Profile(
        model="m",
        micro_batch_size=mbs,
        seq_len=128,
        layer_params=10_000_000,
        embed_params=1_000_000,
        head_params=1_000_000,
        chips={n: ChipProfile({t: tp_entry(f, 0.5, t) for t in (1, 2)}) for n, f in (("X", 1.0), ("Y", 0.5))},
    )
    return CostModel(cl, model, train, prof)


def test_evaluate_prices_inner_dp_as_the_simulator_runs_it():
    cm = problem()
    b = micro_batches(cm.train, 1)
    for stages in ([StageSpec("X", 1, 4, False, 2), StageSpec("Y", 2, 4, False, 1)],
                   [StageSpec("X", 2, 3, False, 1), StageSpec("Y", 1, 5, True, 2)],
                   [StageSpec("X", 1, 2, False, 2), StageSpec("X", 1, 2, False, 2), StageSpec("Y", 1, 4, False, 2)]):
        est = cm.evaluate(stages, 1, b, round_trips=True)
        sim = simulate_stages(cm, stages, 1)
        assert est.iteration_time_s == pytest.approx(sim.iteration_time_s, rel=0.05), stages
        for k, (mm, ps) in enumerate(zip(est.stage_memory_bytes, sim.peak_memory_bytes)):
            assert mm >= ps * (1 - 1e-12), (stages, k)
    # two replicas each compute half of every micro-batch: half the stage time of one tp-1 stage
    one = cm.evaluate([StageSpec("X", 1, 4, False, 1), StageSpec("Y", 2, 4, False)], 1, b)
    two = cm.evaluate([StageSpec("X", 1, 4, False, 2), StageSpec("Y", 2, 4, False)], 1, b)
    assert two.stage_time_s[0] == pytest.approx(one.stage_time_s[0] / 2)


def test_search_proposes_inner_dp_where_it_beats_every_inner_dp_1_plan():
    cm = problem()
    res = search_auto(cm, group_size=2)
    assert any(s.inner_dp > 1 for s in res.best.stages), res.best
    assert res.best.time_s < reference_search(cm, group_size=2) * (1 - 1e-6)
    b = micro_batches(cm.train, res.best.dp)
    sim = simulate_stages(cm, res.best.stages, res.best.dp).iteration_time_s
    assert cm.evaluate(res.best.stages, res.best.dp, b, round_trips=True).iteration_time_s == pytest.approx(
        sim, rel=0.05
    )
    plan = to_plan(Problem(cm.cluster, cm.model, cm.train, cm), res.best, None, "auto", res)
    assert [s.inner_dp for s in plan.stages] == [s.inner_dp for s in res.best.stages]
    plan.validate(num_layers=8, heads=8, kv_heads=8, ffn=4096, vocab=1000, world_size=8)


def test_micro_batch_of_one_keeps_inner_dp_1():
    cm = problem(mbs=1)
    res = search_auto(cm, group_size=2)
    assert all(s.inner_dp == 1 for s in res.best.stages)


def test_idle_chip_plans_get_inner_dp_too():
    """4 + 7 chips: no dp lets every chip serve, so the plan comes from the idle-chip search; its stages tied
    as bottleneck move to inner_dp 2 together, and the simulator confirms the gain over inner_dp 1."""
    from dataclasses import replace
    cm = problem(counts=(4, 7))
    res = search_auto(cm, group_size=2)
    assert sum(s.tp * s.inner_dp for s in res.best.stages) * res.best.dp < 11  # chips left idle
    assert all(s.inner_dp == 2 for s in res.best.stages), res.best
    flat = [replace(s, tp=s.tp * s.inner_dp, inner_dp=1) for s in res.best.stages]
    assert (simulate_stages(cm, res.best.stages, res.best.dp).iteration_time_s
            < simulate_stages(cm, flat, res.best.dp).iteration_time_s)


def random_inner_dp_problem(seed: int) -> CostModel:
    """Two chip types, two sequences per micro-batch (so a stage may split them), TP 1 or 2 (TP costing 10%
    more), random speeds, memory, weights and activations."""
    import random
    rng = random.Random(seed)
    names = ["X", "Y"]
    cl = cluster_from_dict({"name": "t", "chips": [chip(n, rng.choice([2, 4]), rng.choice([10.0, 20.0, 40.0]))
                                                   for n in names]}, "test")
    model = ModelSpec("m", layers=rng.choice([4, 5, 6]), hidden=1024, heads=8, kv_heads=8, ffn=4096, vocab=1000,
                      seq_len=128)
    train = TrainSpec(global_batch=rng.choice([8, 16]), micro_batch_size=2, dtype="bf16", zero1=True,
                      schedule="1f1b")
    speed, act = {n: rng.choice([0.5, 0.8, 1.0, 1.5]) for n in names}, rng.choice([0.5, 2.0])
    prof = Profile(model="m", micro_batch_size=2, seq_len=128, layer_params=rng.choice([10_000_000, 300_000_000]),
                   embed_params=1_000_000, head_params=1_000_000,
                   chips={n: ChipProfile({t: tp_entry(speed[n], act, t) for t in (1, 2)}) for n in names})
    return CostModel(cl, model, train, prof)


@pytest.mark.parametrize("seed", range(16))
def test_fast_search_finds_the_exact_optimum_with_inner_dp_on_random_instances(seed):
    """The reference search enumerates every per-stage inner_dp; the fast search (inner_dp as a local
    search, with layer moves, on the plans it keeps for the re-rank) reaches its optimum. Keeping only the
    best four (no re-rank) it misses by up to 9.7% here: the split-rows optimum can be another order."""
    cm = random_inner_dp_problem(seed)
    want = reference_search(cm, group_size=2, inner_dp=True)
    assert want <= reference_search(cm, group_size=2) * (1 + 1e-12)
    got = search_auto(cm, group_size=2, idle="never").objective_s
    assert got == pytest.approx(want, rel=1e-9)
