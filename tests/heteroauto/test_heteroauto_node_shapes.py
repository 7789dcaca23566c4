"""One chip type in nodes of different sizes (issue 30 item 4: HexiScale S3's one 8-GPU and two 4-GPU
machines), written `nodes: [8, 4, 4]`. A TP group never spans nodes, and a stage whose replicas spread over
nodes all-reduces its gradients over the network. References: an exhaustive assignment of TP groups to
nodes (placement), the brute force over every plan run by the event-loop simulator (the planner), the
ring all-reduce written out by hand (the cost). Hand-set profiles stand in for measured chips; the
simulator stands in for the cluster."""
from __future__ import annotations

import itertools
import random
from dataclasses import replace
from pathlib import Path

import pytest

from heteropp.auto.brute_force import brute_force
from heteropp.auto.cli import main
from heteropp.auto.costs import CostModel, StageSpec
from heteropp.auto.front_door import plan
from heteropp.auto.planning import Problem
from heteropp.auto.plan_sim import simulate_plan, stage_times
from heteropp.auto.profiles import ChipProfile, Profile, TPProfile
from heteropp.auto.replica_sim import simulate_groups
from heteropp.plan import Plan, ReplicaGroup, StagePlan
from heteropp.spec import ModelSpec, SpecError, TrainSpec, cluster_from_dict
from heteropp.spec.placement import PlacementError, StageBlock, place

EX = Path(__file__).resolve().parents[2] / "examples"
CHIP = {"name": "X", "memory_gb": 80, "peak_tflops": 100, "intra_node_bw": 100, "network_bw": 0.5,
        "memory_fraction": 1.0}
LAYER_PARAMS = 100_000_000


def _problem(shape: dict, tp_max: int = 1) -> Problem:
    chip = {**CHIP, "tp_max": tp_max, **shape}
    cluster = cluster_from_dict({"name": "n", "chips": [chip]}, "test")
    model = ModelSpec("m", layers=4, hidden=1024, heads=8, kv_heads=8, ffn=4096, vocab=1000, seq_len=128)
    train = TrainSpec(global_batch=8, micro_batch_size=1, dtype="bf16", zero1=True, schedule="1f1b")
    t = TPProfile(fwd_s=0.1, bwd_s=0.2, recompute_s=0.1, wgrad_s=0.1, act_bytes=1e8, ckpt_bytes=1e7, optim_s=0.01,
                  head_s=0.1)
    prof = Profile(model="m", micro_batch_size=1, seq_len=128, layer_params=LAYER_PARAMS, embed_params=10_000_000,
                   head_params=10_000_000, chips={"X": ChipProfile({t_: t for t_ in (1, 2, 4) if t_ <= tp_max})})
    return Problem(cluster, model, train, CostModel(cluster, model, train, prof))


def test_a_type_in_nodes_of_different_sizes_reads_as_its_nodes():
    c = cluster_from_dict({"chips": [{**CHIP, "nodes": [8, 4, 4]}]}, "test").chips[0]
    assert (c.count, c.node_sizes, c.tp_max, c.chips_per_node) == (16, (8, 4, 4), 8, 8)
    old = cluster_from_dict({"chips": [{**CHIP, "count": 10, "chips_per_node": 4}]}, "test").chips[0]
    assert old.node_sizes == (4, 4, 2)


@pytest.mark.parametrize("extra,field,words", [
    ({"nodes": [8, 4, 4], "count": 12}, "chips[0].count", "hold 16 chips"),
    ({"nodes": [8, 4], "chips_per_node": 8}, "chips[0].chips_per_node", "one of the two"),
    ({"nodes": []}, "chips[0].nodes", "the chips of each node"),
    ({"nodes": [4, 0]}, "chips[0].nodes[1]", "from 1 to"),
    ({"nodes": [4, "x"]}, "chips[0].nodes[1]", "from 1 to"),
    ({"nodes": [4, 4], "tp_max": 8}, "chips[0].tp_max", "largest node's 4 chips"),
    ({"nodes": 8}, "chips[0].nodes", "a list"),
])
def test_bad_node_shapes_name_the_field(extra, field, words):
    with pytest.raises(SpecError) as e:
        cluster_from_dict({"chips": [{**CHIP, **extra}]}, "test")
    assert e.value.field == field and words in str(e.value), str(e.value)


def test_the_cli_exits_2_on_a_bad_node_shape(tmp_path, capsys):
    path = tmp_path / "cluster.yaml"
    path.write_text("chips:\n  - {name: A, nodes: [2, 2], count: 5, memory_gb: 4, peak_tflops: 1, "
                    "intra_node_bw: 5, network_bw: 2}\n")
    assert main(["plan", "--cluster", str(path), "--model", "tiny", "--train", str(EX / "training" / "tiny.yaml"),
                 "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "'chips[0].count'" in err and "Traceback" not in err, err


def _fits_exhaustively(nodes: list[int], groups: list[int]) -> bool:
    """Whether some assignment of the TP groups (sizes) to nodes keeps every node within its chips."""
    for where in itertools.product(range(len(nodes)), repeat=len(groups)):
        used = [0] * len(nodes)
        for g, n in zip(groups, where):
            used[n] += g
        if all(u <= c for u, c in zip(used, nodes)):
            return True
    return False


def test_placement_fits_exactly_when_some_assignment_does():
    """On random node shapes and stages, place() succeeds exactly when an exhaustive search finds an
    assignment, and what it returns keeps every TP group in one node within the node's chips."""
    rng = random.Random(0)
    for _ in range(300):
        nodes = [rng.randint(1, 8) for _ in range(rng.randint(1, 3))]
        stages = [StageBlock("X", rng.choice([1, 2, 4]), rng.randint(1, 2)) for _ in range(rng.randint(1, 3))]
        groups = [s.tp for s in stages for _ in range(s.replicas)]
        expect = _fits_exhaustively(nodes, groups)
        try:
            where = place({"X": nodes}, stages)
        except PlacementError:
            assert not expect, (nodes, stages)
            continue
        assert expect, (nodes, stages)
        used = [0] * len(nodes)
        for s, w in zip(stages, where):
            for n in w:
                used[n] += s.tp
        assert all(u <= c for u, c in zip(used, nodes)), (nodes, stages, where)


def test_a_stage_spread_over_nodes_syncs_its_gradients_over_the_network():
    """dp 2 on nodes [2, 1, 1]: the first stage's replicas share the 2-chip node, the second's sit on the
    two 1-chip nodes; their update differs by the ring all-reduce at network vs node bandwidth."""
    pb = _problem({"nodes": [2, 1, 1]})
    st, _ = stage_times(pb.cm, [StageSpec("X", 1, 2, False), StageSpec("X", 1, 2, False)], 2)
    params = 2 * LAYER_PARAMS + 10_000_000  # two layers and the embedding / the head
    # the engine's ZeRO-1 step: fp32 gradients all-reduced, then the bf16 weights all-gathered
    ring = 2 * (2 - 1) / 2 * 4 * params + (2 - 1) / 2 * 2 * params
    optim = 2 * 0.01 / 2 + 0.01 * 10_000_000 / LAYER_PARAMS / 2  # ZeRO-1: half the optimizer step
    assert st[0].update == pytest.approx(ring / (100 * 1e9) + optim, rel=1e-9)
    assert st[1].update == pytest.approx(ring / (0.5 * 1e9) + optim, rel=1e-9)


def test_replica_groups_sync_each_layer_over_the_nodes_its_holders_are_placed_on():
    """The replica simulator prices a layer's all-reduce on the placement of every stage holding it: a plan
    of one stage list on nodes [2, 1, 1] (one stage in the 2-chip node, one spread) as plan_sim prices it;
    two pipelines written as replica groups, every layer's two holders then on two nodes, as the stage
    list on four 1-chip nodes (every sync over the network), both without ZeRO-1 as the engine runs groups."""
    stages = [StagePlan("X", 1, 2), StagePlan("X", 1, 2)]
    one = Plan(stages, dp=2, micro_batch_size=1, micro_batches=4, schedule="1f1b")
    two = Plan.of_replicas([ReplicaGroup([replace(s) for s in stages], 4) for _ in range(2)], 1, schedule="1f1b")
    pb = _problem({"nodes": [2, 1, 1]})
    assert simulate_groups(pb.cm, one).iteration_time_s == pytest.approx(
        simulate_plan(pb.cm, one).iteration_time_s, rel=1e-12)
    spread = _problem({"nodes": [1, 1, 1, 1]})
    whole = CostModel(spread.cluster, spread.model, replace(spread.train, zero1=False), spread.cm.profile)
    assert simulate_groups(pb.cm, two).iteration_time_s == pytest.approx(
        simulate_plan(whole, one).iteration_time_s, rel=1e-12)


@pytest.mark.parametrize("shape,dp,layers", [
    ({"nodes": [2, 1, 1]}, 2, [3, 1]),  # one stage on the 2-chip node; the lighter one spread
    ({"count": 4, "chips_per_node": 4}, 4, [4]),  # one node: every chip a replica
    ({"nodes": [1, 1, 1, 1]}, 1, [1, 1, 1, 1]),  # every sync over the network: a pipeline of four
])
def test_node_shapes_change_the_best_plan_and_the_planner_finds_it(shape, dp, layers):
    """Four chips of one type on a 0.5 GB/s network: the best plan depends on how the chips sit in nodes,
    and the planner's plan simulates as fast as the brute force's best."""
    pb = _problem(shape)
    best, best_dp, best_stages, _ = brute_force(pb, extended=True)
    assert (best_dp, [s.layers for s in best_stages]) == (dp, layers)
    got = plan(pb).plan
    assert got.iteration_time_s <= best * (1 + 1e-9)
    got.validate(num_layers=4, nodes={c.name: c.node_sizes for c in pb.cluster.chips})


def test_a_plan_whose_tp_groups_fit_no_node_is_refused_naming_the_stage():
    """nodes [4, 2, 2] hold one TP-4 group: a plan with two is refused (the count alone, 8 chips, allows it),
    and the planner never returns one."""
    nodes = {"X": (4, 2, 2)}
    two = Plan([StagePlan("X", 4, 2), StagePlan("X", 4, 2)], dp=1, micro_batch_size=1, micro_batches=8)
    two.validate(available={"X": 8})
    with pytest.raises(SpecError) as e:
        two.validate(nodes=nodes)
    assert e.value.field.startswith("stages[") and e.value.field.endswith("].tp"), str(e.value)
    Plan([StagePlan("X", 4, 2), StagePlan("X", 2, 1), StagePlan("X", 2, 1)], dp=1, micro_batch_size=1,
         micro_batches=8).validate(nodes=nodes)
    got = plan(_problem({"nodes": [4, 2, 2]}, tp_max=4)).plan
    got.validate(num_layers=4, nodes=nodes)


def _random_node_problem(rng: random.Random) -> Problem:
    """Two one-chip-stage types X and Y in nodes of one or two chips, their own network (0.2-2 GB/s) and a
    link between them, 3-6 layers of 100 M parameters, 4 or 8 micro-batches."""
    chips = []
    for n in "XY":
        nodes = [rng.randint(1, 2) for _ in range(rng.randint(1, 3))]
        chips.append({"name": n, "nodes": nodes, "memory_gb": rng.choice([8, 20]), "peak_tflops": 100, "tp_max": 1,
                      "intra_node_bw": 100, "network_bw": rng.choice([0.2, 0.5, 2.0]), "memory_fraction": 1.0})
    cluster = cluster_from_dict({"name": "r", "chips": chips,
                                 "links": [{"between": ["X", "Y"], "bandwidth": rng.choice([0.05, 0.5])}]}, "test")
    model = ModelSpec("m", layers=rng.randint(3, 6), hidden=1024, heads=8, kv_heads=8, ffn=4096, vocab=1000,
                      seq_len=128)
    train = TrainSpec(global_batch=rng.choice([4, 8]), micro_batch_size=1, dtype="bf16", zero1=True, schedule="1f1b")
    speed = {"X": 0.1, "Y": rng.choice([0.05, 0.1, 0.15])}
    prof = Profile(model="m", micro_batch_size=1, seq_len=128, layer_params=LAYER_PARAMS, embed_params=10_000_000,
                   head_params=10_000_000,
                   chips={n: ChipProfile({1: TPProfile(fwd_s=f, bwd_s=2 * f, recompute_s=f, wgrad_s=f, act_bytes=1e9,
                                                       ckpt_bytes=1e8, optim_s=0.01, head_s=f)})
                          for n, f in speed.items()})
    return Problem(cluster, model, train, CostModel(cluster, model, train, prof))


@pytest.mark.parametrize("index,before", [(13, 0.114), (14, 0.071), (20, 0.160)])
def test_the_search_splits_layers_knowing_which_stage_spreads_over_nodes(index, before):
    """Random node shapes (seed 0): the planner's plan equals the brute force's best. Before the search's
    objective placed its stage sequences it priced every stage's sync as inside one node, split the layers
    evenly and was `before` slower (nodes [1, 1, 2]: the brute force keeps 4 of 5 layers on the stage that
    has the 2-chip node)."""
    rng = random.Random(0)
    for _ in range(index + 1):
        pb = _random_node_problem(rng)
    best = brute_force(pb, extended=True)[0]
    got = plan(pb).plan
    assert got.iteration_time_s <= best * (1 + 1e-9), f"{100 * (got.iteration_time_s / best - 1):.1f}% slower"
    got.validate(num_layers=pb.model.layers, nodes={c.name: c.node_sizes for c in pb.cluster.chips})


def _tp_problem(shape: dict, net: float) -> Problem:
    """Eight chips of one type, TP 1, 2 or 4 (TP t computes 1/t of a layer, 10% slower beyond 1), 4 layers,
    4 micro-batches."""
    chip = {**CHIP, "tp_max": 4, "network_bw": net, **shape}
    cluster = cluster_from_dict({"name": "n", "chips": [chip]}, "test")
    model = ModelSpec("m", layers=4, hidden=1024, heads=8, kv_heads=8, ffn=4096, vocab=1000, seq_len=128)
    train = TrainSpec(global_batch=4, micro_batch_size=1, dtype="bf16", zero1=True, schedule="1f1b")
    slower = {1: 1.0, 2: 1.1, 4: 1.1}
    tps = {t: TPProfile(fwd_s=0.1 / t * slower[t], bwd_s=0.2 / t * slower[t], recompute_s=0.1 / t, wgrad_s=0.1 / t,
                        act_bytes=1e8 / t, ckpt_bytes=1e7, optim_s=0.01 / t, head_s=0.1 / t) for t in (1, 2, 4)}
    prof = Profile(model="m", micro_batch_size=1, seq_len=128, layer_params=LAYER_PARAMS, embed_params=10_000_000,
                   head_params=10_000_000, chips={"X": ChipProfile(tps)})
    return Problem(cluster, model, train, CostModel(cluster, model, train, prof))


@pytest.mark.parametrize("shape,net,dp,stages", [
    ({"nodes": [4, 2, 2]}, 0.2, 1, [(2, 1), (2, 1), (4, 2)]),  # one TP-4 group: the rest at TP 2
    ({"count": 8, "chips_per_node": 4}, 0.2, 1, [(4, 2), (4, 2)]),
    ({"nodes": [2, 2, 2, 2], "tp_max": 2}, 0.2, 1, [(2, 1)] * 4),
    ({"nodes": [4, 2, 2]}, 1.0, 2, [(2, 3), (2, 1)]),
    ({"count": 8, "chips_per_node": 4}, 3.0, 2, [(4, 4)]),  # a network fast enough for dp 2's update
])
def test_node_shapes_decide_the_tp_groups_and_the_planner_equals_the_tp_brute_force(shape, net, dp, stages):
    """With TP, the node shapes decide which TP groups exist; the brute force over every (chip, tp) stage
    sequence at every dp (plans whose TP group fits in no node left out) and the planner agree."""
    pb = _tp_problem(shape, net)
    best, best_dp, best_stages, _ = brute_force(pb, tp=True)
    assert (best_dp, [(s.tp, s.layers) for s in best_stages]) == (dp, stages)
    got = plan(pb).plan
    assert got.iteration_time_s <= best * (1 + 1e-9)
    got.validate(num_layers=4, nodes={c.name: c.node_sizes for c in pb.cluster.chips})
