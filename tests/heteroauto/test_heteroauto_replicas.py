"""Replicas with different pipelines (issue 30 item 4; HexiScale S3, HetAuto's outer x inner): the plan
schema's `replicas`, their simulated time (replica_sim) and the planner's per-replica candidates
(replicas.py). References: the event-loop simulator of one stage list (plan_sim), the ring all-reduce and
the one-stage pipeline written out by hand, and a brute force over every share of the global batch.
Hand-set profiles stand in for measured chips; the simulator stands in for the cluster."""
from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch import nn

from bench.heteroauto_vs_brute import random_problem
from heteropp.auto.brute_force import brute_force
from heteropp.auto.costs import CostModel
from heteropp.auto.front_door import Budget
from heteropp.auto.plan_sim import simulate_plan
from heteropp.auto.planning import Problem
from heteropp.auto.profiles import ChipProfile, Profile, TPProfile
from heteropp.auto.replica_sim import simulate_groups
from heteropp.auto.replicas import _join_split, _joined, best_per_replica, partitions
from heteropp.engine.checks import check_run
from heteropp.engine.optim import ZeroAdamW
from heteropp.plan import Plan, ReplicaGroup, StagePlan
from heteropp.spec import ModelSpec, SpecError, TrainSpec, cluster_from_dict

LAYER_PARAMS, END_PARAMS = 10_000_000, 1_000_000


def _two_types(link: float = 0.5) -> Problem:
    """One X and one Y chip (Y 1.5x slower) in nodes of their own, joined by `link` GB/s; 4 layers, 8
    micro-batches of one sequence."""
    return _one_chip_each({"X": 0.1, "Y": 0.15}, [{"between": ["X", "Y"], "bandwidth": link}])


def _one_chip_each(forward_s: dict[str, float], links: list[dict]) -> Problem:
    """One chip of each type (a layer's forward taking forward_s[type]) in a node of its own."""
    chips = [{"name": n, "count": 1, "memory_gb": 80, "peak_tflops": 100, "chips_per_node": 1, "tp_max": 1,
              "intra_node_bw": 100, "network_bw": 10.0, "memory_fraction": 1.0} for n in forward_s]
    cluster = cluster_from_dict({"name": "types", "chips": chips, "links": links}, "test")
    model = ModelSpec("m", layers=4, hidden=1024, heads=8, kv_heads=8, ffn=4096, vocab=1000, seq_len=128)
    train = TrainSpec(global_batch=8, micro_batch_size=1, dtype="bf16", zero1=True, schedule="1f1b")
    prof = Profile(model="m", micro_batch_size=1, seq_len=128, layer_params=LAYER_PARAMS, embed_params=END_PARAMS,
                   head_params=END_PARAMS,
                   chips={n: ChipProfile({1: TPProfile(fwd_s=f, bwd_s=2 * f, recompute_s=f, wgrad_s=f, act_bytes=1e8,
                                                       ckpt_bytes=1e7, optim_s=0.01, head_s=f)})
                          for n, f in forward_s.items()})
    return Problem(cluster, model, train, CostModel(cluster, model, train, prof))


def _per_type(x_mb: int, y_mb: int) -> Plan:
    return Plan.of_replicas([ReplicaGroup([StagePlan("X", 1, 4)], x_mb), ReplicaGroup([StagePlan("Y", 1, 4)], y_mb)],
                            1, schedule="1f1b", num_layers=4)


def test_a_plan_of_replica_groups_round_trips_and_counts_every_group():
    p = Plan.of_replicas([ReplicaGroup([StagePlan("X", 1, 2), StagePlan("X", 1, 2)], 3, dp=2),
                          ReplicaGroup([StagePlan("Y", 1, 1), StagePlan("Y", 1, 3)], 2)], 1, schedule="1f1b")
    d = p.to_dict()
    assert "stages" not in d and len(d["replicas"]) == 2
    back = Plan.from_dict(d)
    assert back.to_dict() == d
    assert (back.global_batch, back.world_size, back.chips_used()) == (2 * 3 + 2, 6, {"X": 4, "Y": 2})
    assert [s.first_layer for s in back.groups[1].stages] == [0, 1]


@pytest.mark.parametrize("edit,field,words", [
    (lambda d: d["replicas"][1]["stages"][0].update(tp=2), "replicas[1].stages[0].tp", "layer 0 at tp=2"),
    (lambda d: d.update(stages=[]), "stages", "given together with replicas"),
    (lambda d: d.update(schedule="h1f1b"), "schedule", "without parameters"),
    (lambda d: d["replicas"][1]["stages"][0].update(layers=2), "replicas[1].stages[*].layers", "layers sum to 2"),
    (lambda d: d["replicas"][0].update(micro_batches=0), "replicas[0].micro_batches", "got 0"),
    (lambda d: d.update(replicas=[]), "replicas", "non-empty"),
    (lambda d: d["replicas"][0].update(pipelines=2), "replicas[0].pipelines", "unknown field"),
])
def test_bad_replica_groups_name_the_field(edit, field, words):
    d = _per_type(5, 3).to_dict()
    for g in d["replicas"]:
        for s in g["stages"]:
            s.pop("first_layer")
    d.pop("chips_used")
    edit(d)
    with pytest.raises(SpecError) as e:
        Plan.from_dict(d)
    assert e.value.field == field and words in str(e.value), str(e.value)


def test_the_chips_of_every_group_count_against_the_cluster():
    with pytest.raises(SpecError) as e:
        Plan.of_replicas([ReplicaGroup([StagePlan("X", 1, 4)], 4), ReplicaGroup([StagePlan("X", 1, 4)], 4)], 1,
                         schedule="1f1b").validate(available={"X": 1})
    assert "plan uses 2 chips of type 'X'" in str(e.value)


def test_a_chip_type_of_a_later_group_is_checked_against_the_cluster_and_the_chip_map():
    """Every group's stages name chip types the cluster has and the engine can map, not only the first's."""
    plan = Plan.of_replicas([ReplicaGroup([StagePlan("X", 1, 4)], 4), ReplicaGroup([StagePlan("Q", 1, 4)], 4)], 1,
                            schedule="1f1b")
    with pytest.raises(SpecError) as e:
        plan.validate(available={"X": 1, "Y": 1})
    assert e.value.field == "replicas[1].stages[0].chip" and "'Q' is not in the cluster" in str(e.value)
    with pytest.raises(SpecError) as e:
        check_run(plan, _two_types().model, "plan.json", {"X": "cpu"}, ["1f1b"])
    assert e.value.field == "replicas[1].stages[0].chip" and "'Q'" in str(e.value), str(e.value)


def test_too_many_chips_of_a_type_name_the_replica_groups():
    with pytest.raises(SpecError) as e:
        Plan.of_replicas([ReplicaGroup([StagePlan("X", 1, 4)], 4, dp=2), ReplicaGroup([StagePlan("Y", 1, 4)], 4)], 1,
                         schedule="1f1b").validate(available={"X": 1, "Y": 1})
    assert e.value.field == "replicas[*].stages[*].tp * dp * inner_dp", e.value.field


@pytest.mark.parametrize("zero1", [False, True])
def test_one_group_and_identical_groups_simulate_as_one_stage_list(zero1: bool):
    """A plan of one stage list takes the event-loop simulator's time of the stage list at dp 2; the same
    plan written as two identical groups of one pipeline each takes it with the plan's zero1 (with ZeRO-1 each
    holder of a part keeps half its optimizer state, as a DP rank of the stage list does; without, the whole),
    its peak memory too, links shared by both pipelines."""
    rng = random.Random(3)
    checked = 0
    while checked < 4:
        pb = random_problem(rng, "1f1b", "default")
        mb, layers = pb.train.micro_batches_total, pb.model.layers
        if mb % 2 or min(c.count for c in pb.cluster.chips) < 2:
            continue
        stages = [StagePlan("X", 1, layers // 2), StagePlan("Z", 1, layers - layers // 2)]
        one = Plan(stages, dp=2, micro_batch_size=1, micro_batches=mb // 2, schedule="1f1b")
        two = Plan.of_replicas([ReplicaGroup([StagePlan(s.chip, s.tp, s.layers) for s in stages], mb // 2)
                                for _ in range(2)], 1, schedule="1f1b", zero1=zero1)
        want = simulate_plan(pb.cm, one).iteration_time_s
        assert simulate_groups(pb.cm, one).iteration_time_s == pytest.approx(want, rel=1e-12)
        as_run = CostModel(pb.cluster, pb.model, replace(pb.train, zero1=zero1), pb.cm.profile)
        ref, got = simulate_plan(as_run, one), simulate_groups(pb.cm, two)
        assert got.iteration_time_s == pytest.approx(ref.iteration_time_s, rel=1e-12)
        for peaks in got.peak_memory_bytes:
            assert peaks == pytest.approx(ref.peak_memory_bytes, rel=1e-12)
        checked += 1


def test_with_zero1_each_part_keeps_its_optimizer_state_shared_by_all_its_holders():
    """X: layers 0-1 | 2-3; Y: layer 0 in two inner replicas | 1-3. The embedding and layer 0 have 3 holders (X's
    stage 0, Y's two), layers 1-3 and the head 2: with ZeRO-1 each stage's peak is its peak without, less its
    parts' optimizer state but 1/holders of each, at the bytes per parameter the engine's optimizer keeps
    (master weight and two moments of bf16 weights)."""
    pb = _two_types(0.5)
    groups = [ReplicaGroup([StagePlan("X", 1, 2), StagePlan("X", 1, 2)], 2),
              ReplicaGroup([StagePlan("Y", 1, 1, inner_dp=2), StagePlan("Y", 1, 3)], 2)]
    on, off = (simulate_groups(pb.cm, Plan.of_replicas(groups, 2, schedule="1f1b", num_layers=4, zero1=z))
               for z in (True, False))
    opt = ZeroAdamW([nn.Parameter(torch.zeros(8, dtype=torch.bfloat16))], 1e-3)
    state_b = opt.m.element_size() + opt.v.element_size() + opt.master.element_size()
    parts = {(0, 0): {"embed": 3, 0: 3, 1: 2}, (0, 1): {2: 2, 3: 2, "head": 2},
             (1, 0): {"embed": 3, 0: 3}, (1, 1): {1: 2, 2: 2, 3: 2, "head": 2}}
    for (g, k), held in parts.items():
        saved = sum((LAYER_PARAMS if isinstance(p, int) else END_PARAMS) * state_b * (1 - 1 / n)
                    for p, n in held.items())
        assert on.peak_memory_bytes[g][k] == pytest.approx(off.peak_memory_bytes[g][k] - saved, rel=1e-12), (g, k)


def test_two_different_groups_take_the_slowest_group_then_each_layers_all_reduce():
    """X alone with 5 micro-batches, Y alone with 3: each a one-stage pipeline (every micro-batch's forward
    and backward in turn), then every layer, the embedding and the head all-reduced between the two chips
    over the 0.5 GB/s link (the slower of it and the 10 GB/s network), then the whole optimizer step."""
    pb = _two_types(0.5)
    # 4 layers' forward and backward (3 f), the embedding's and the head's (head_s = f)
    per_mb = {c: 4 * 3 * f + pb.cm.profile.get(c, 1).embed_s + f for c, f in (("X", 0.1), ("Y", 0.15))}
    compute = max(5 * per_mb["X"], 3 * per_mb["Y"])
    ring = lambda params: 2 * (2 - 1) / 2 * 4 * params / 0.5e9  # noqa: E731 (the engine's fp32 gradients, 2 ranks)
    sync = 4 * ring(LAYER_PARAMS) + 2 * ring(END_PARAMS)
    optim = (4 + 2 * END_PARAMS / LAYER_PARAMS) * 0.01
    got = simulate_groups(pb.cm, _per_type(5, 3)).iteration_time_s
    assert got == pytest.approx(compute + sync + optim, rel=1e-9)


def test_the_per_replica_plan_beats_every_single_stage_list_and_equals_the_brute_force_over_shares():
    """With a 0.5 GB/s link, X and Y each training its own replica (the batch split 5:3) is faster than any
    plan of one stage list for every replica (the brute force over the larger space: either type alone,
    both in one pipeline, idle chips, any dp); the candidate equals the best over every share."""
    pb = _two_types(0.5)
    single = brute_force(pb, extended=True)[0]
    got = best_per_replica(pb)
    assert got is not None and got.iteration_time_s < single * 0.95, (got, single)
    shares = [_joined(pb, [["X"], ["Y"]], (n, 8 - n), Budget(baselines=False)) for n in range(1, 8)]
    assert got.iteration_time_s == pytest.approx(min(p.iteration_time_s for p in shares if p), rel=1e-12)
    got.validate(num_layers=4, available={"X": 1, "Y": 1})
    assert [g.micro_batches for g in got.replicas] == [5, 3]
    assert got.zero1 is True  # the spec's: replica_sim priced it so (above) and the engine runs it so


def test_a_per_replica_plan_with_zero1_states_each_stages_memory_with_its_parts_state_shared():
    """X and Y each one stage of every part, so each part has 2 holders: under ZeRO-1 each stage's memory
    estimate is the one without ZeRO-1 (the whole state) less half its parts' optimizer state, at the bytes per
    parameter the engine's optimizer keeps for bf16 weights (its group alone, one chip, would keep it whole)."""
    pb = _two_types(0.5)
    off = best_per_replica(Problem(pb.cluster, pb.model, replace(pb.train, zero1=False),
                                   CostModel(pb.cluster, pb.model, replace(pb.train, zero1=False), pb.cm.profile)))
    on = best_per_replica(pb)
    assert on is not None and off is not None and (on.zero1, off.zero1) == (True, False)
    opt = ZeroAdamW([nn.Parameter(torch.zeros(8, dtype=torch.bfloat16))], 1e-3)
    state_b = opt.m.element_size() + opt.v.element_size() + opt.master.element_size()
    half = (4 * LAYER_PARAMS + 2 * END_PARAMS) * state_b / 2 / 1e9
    for g_on, g_off in zip(on.replicas, off.replicas):
        for a, b in zip(g_on.stages, g_off.stages):
            assert (a.layers, b.layers) == (4, 4)
            assert a.est_memory_gb == pytest.approx(b.est_memory_gb - half, abs=1.5e-3), (a, b)


def test_every_split_into_replica_groups_trains_the_whole_global_batch():
    """X with Y and Z 30 times slower: by throughput Y and Z would take a quarter of a micro-batch each, and
    every group takes at least one; the shares still add up to the training spec's 8 micro-batches."""
    pb = _one_chip_each({"X": 0.1, "Y": 3.0, "Z": 3.0}, [])
    for split in partitions(["X", "Y", "Z"]):
        if len(split) > 1:
            got = _join_split(pb, split, Budget(baselines=False))
            assert got is not None and got.global_batch == pb.train.global_batch, (split, got and got.replicas)


def test_partitions_are_every_set_partition():
    """Bell numbers 1, 2, 5, 15, 52, each partition once."""
    for n, bell in zip(range(1, 6), (1, 2, 5, 15, 52)):
        got = [tuple(sorted(tuple(sorted(g)) for g in p)) for p in partitions(list("abcde"[:n]))]
        assert len(got) == len(set(got)) == bell


def test_the_cli_plans_replica_groups_on_request_simulates_them_and_heteropp_run_takes_them(tmp_path):
    """Two chips of A and two of B (0.6x A's speed) over a 1 GB/s link, the analytic profile: with
    --per-replica the plan is two replica groups (A with 5 micro-batches, B with 3), faster than the plan
    of one stage list; `heteroauto simulate` prices the file as the planner did; `heteropp run` writes its run
    configuration, checkpoints included."""
    from heteropp.auto.cli import main
    from heteropp.cli import main as run_main
    cluster = tmp_path / "two.yaml"
    cluster.write_text("chips:\n"
                       "  - {name: A, count: 2, memory_gb: 16, peak_tflops: 0.001, chips_per_node: 2, "
                       "intra_node_bw: 50, network_bw: 5}\n"
                       "  - {name: B, count: 2, memory_gb: 16, peak_tflops: 0.0006, chips_per_node: 2, "
                       "intra_node_bw: 50, network_bw: 5}\n"
                       "links:\n  - {between: [A, B], bandwidth: 1}\n")
    train = str(Path(__file__).resolve().parents[2] / "examples" / "training" / "tiny.yaml")
    inputs = ["--cluster", str(cluster), "--model", "tiny", "--train", train]
    single, joined = tmp_path / "single.json", tmp_path / "joined.json"
    assert main(["plan", *inputs, "--no-progress", "--json", str(single)]) == 0
    assert main(["plan", *inputs, "--no-progress", "--per-replica", "--json", str(joined)]) == 0
    got = Plan.load(joined)
    assert [g.micro_batches for g in got.replicas] == [5, 3]
    assert got.iteration_time_s < Plan.load(single).iteration_time_s
    out = tmp_path / "sim.json"
    assert main(["simulate", str(joined), *inputs, "--json", str(out)]) == 0
    assert json.loads(out.read_text())["iteration_time_s"] == pytest.approx(got.iteration_time_s, rel=1e-12)
    run = ["run", "--plan", str(joined), "--model", "tiny", "--steps", "1", "--chip-map", "A=cpu,B=cpu"]
    assert run_main([*run, "--checkpoint-dir", str(tmp_path / "ck"), "--write-config", str(tmp_path / "run.json")]) == 0
    written = json.loads((tmp_path / "run.json").read_text())
    assert len(written["plan"]["replicas"]) == 2 and written["options"]["checkpoint_dir"] == str(tmp_path / "ck")


def test_per_replica_with_a_searched_micro_batch_size_exits_2_naming_the_flag(capsys):
    """Replica groups are planned at the training spec's micro-batch size, under its one profile: with the
    size searched (and a profile per size) the two plans would be compared across sizes and profiles."""
    from heteropp.auto.cli import main
    ex = Path(__file__).resolve().parents[2] / "examples"
    assert main(["plan", "--cluster", str(ex / "clusters" / "two-cpu.yaml"), "--model", "tiny", "--train",
                 str(ex / "training" / "tiny.yaml"), "--no-progress", "--per-replica",
                 "--micro-batch-sizes", "1,2"]) == 2
    err = capsys.readouterr().err
    assert "'--per-replica'" in err and "--micro-batch-sizes" in err and "Traceback" not in err, err


def test_a_split_that_fits_only_with_the_state_shared_across_groups_is_found():
    """Chips of 0.7 GB: X or Y with its own replicas only sharing the optimizer state keeps it whole (42M
    parameters at 18 bytes: 0.756 GB before any activation), so no group fitted planned alone (before: no plan);
    every other group holds every part too, so each group is planned with one more holder per other group, and
    the joined plan, each part held by both, keeps half the state: each stage's simulated peak is under 0.7 GB."""
    pb = _two_types(0.5)
    small = replace(pb.cluster, chips=tuple(replace(c, memory_gb=0.7) for c in pb.cluster.chips))
    got = best_per_replica(Problem(small, pb.model, pb.train, CostModel(small, pb.model, pb.train, pb.cm.profile)))
    assert got is not None and [[s.chip for s in g.stages] for g in got.replicas] == [["X"], ["Y"]]
    peaks = simulate_groups(pb.cm, got).peak_memory_bytes
    assert all(p <= 0.7e9 for g in peaks for p in g), peaks
    assert all(s.est_memory_gb <= 0.7 for g in got.replicas for s in g.stages)
