"""Under torchrun, ranks follow the node rule (heteropp/engine/node_ranks.py). Two real torchrun agents on
this machine's loopback stand in for two hosts (static rendezvous, --node-rank 0 and 1): node 0 has one chip
of type A, node 1 two. A plan of a TP-2 stage then a TP-1 stage must run its TP-2 group on node 1, the only
node it fits in (derived by hand), while torchrun alone numbers node 0's worker rank 0, which the plan gives
to the TP-2 stage: its group would span the two hosts (what ran before: node 0 reported stage 0, node 1
stages 0 and 1). With the node list in the config, each agent's workers report the stage the hand placement
gives their node, and the loss is the single-process reference's. Which list entry a node is follows its
process count (and chip type, where its host says it), not its --node-rank alone: a launch with the two
nodes' --node-rank swapped runs as well (test_heteropp_torchrun_rdzv.py covers the c10d rendezvous, where
GROUP_RANK is arrival order); one that matches no reading of the list is refused naming the node."""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys

import pytest

from heteropp.engine import RunConfig
from heteropp.engine.node_ranks import ranks_by_node, torchrun_rank
from heteropp.plan import Plan, ReplicaGroup, StagePlan
from heteropp.spec.errors import SpecError
from tests.heteropp.heteropp_helpers import MODEL, check_losses, reference

STEPS = 2
PLAN = Plan([StagePlan("A", 2, 2), StagePlan("A", 1, 2, first_layer=2)], dp=1, micro_batch_size=1,
            micro_batches=2, num_layers=MODEL.layers)
NODES = [["A", 1], ["A", 2]]  # node 0: one chip, node 1: two
_STAGE_LINE = re.compile(r"rank (\d+): stage (\d+) ")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(tmp_path, nodes: list[list[object]] | None, procs: list[int],
            plan: Plan = PLAN) -> list[subprocess.CompletedProcess]:
    """One torchrun agent per node (static rendezvous on loopback), `procs[i]` workers on node i."""
    cfg = RunConfig(plan=plan.to_dict(), model=RunConfig.model_dict(MODEL), steps=STEPS, backend="gloo",
                    chip_map={"A": "cpu", "B": "cpu"}, timeout_s=60, verbose=True,
                    loss_log=str(tmp_path / "loss.jsonl"), nodes=nodes)
    path = tmp_path / "run.json"
    path.write_text(json.dumps(cfg.__dict__))
    port = _port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    agents = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", str(len(procs)),
                                "--node-rank", str(i), f"--nproc-per-node={n}", "--master-addr", "127.0.0.1",
                                "--master-port", str(port), "--max-restarts", "0", "-m", "heteropp.engine.worker",
                                "--config", str(path)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True) for i, n in enumerate(procs)]
    out = []
    for a in agents:
        text, _ = a.communicate(timeout=300)
        out.append(subprocess.CompletedProcess(a.args, a.returncode, text))
    return out


def _stages_per_node(runs: list[subprocess.CompletedProcess]) -> list[list[int]]:
    for r in runs:
        assert r.returncode == 0, r.stdout[-3000:]
    return [sorted(int(m.group(2)) for m in _STAGE_LINE.finditer(r.stdout)) for r in runs]


def test_the_node_rule_by_hand():
    """The TP-2 stage (plan ranks 0 and 1) fits only node 1; the TP-1 stage (rank 2) takes node 0."""
    assert ranks_by_node(PLAN, NODES) == [[2], [0, 1]]


def test_under_torchrun_a_tp_group_runs_on_one_node(tmp_path):
    runs = _launch(tmp_path, NODES, [1, 2])
    assert _stages_per_node(runs) == [[1], [0, 0]]
    losses = [json.loads(line)["loss"] for line in (tmp_path / "loss.jsonl").read_text().splitlines()]
    check_losses(losses, reference(PLAN.global_batch)["losses"][:STEPS], "torchrun by node")


def test_under_torchrun_a_launch_with_the_node_ranks_swapped_runs_each_node_as_what_it_is(tmp_path):
    """The two-chip host started as --node-rank 0: it is the list's two-chip node all the same (before, every
    worker was refused, "2 processes on node 0"), and runs the TP-2 stage."""
    runs = _launch(tmp_path, NODES, [2, 1])
    assert _stages_per_node(runs) == [[0, 0], [1]]
    losses = [json.loads(line)["loss"] for line in (tmp_path / "loss.jsonl").read_text().splitlines()]
    check_losses(losses, reference(PLAN.global_batch)["losses"][:STEPS], "torchrun, node ranks swapped")


def test_under_torchrun_a_launch_that_matches_no_node_list_reading_is_refused_naming_the_node(tmp_path):
    """Two workers on each node: the list has one two-process node, so node 1 is left without an entry. Every
    worker exits 2 before any process group forms, naming node 1, without a traceback of ours (torchrun's
    agent then prints its own ChildFailedError)."""
    runs = _launch(tmp_path, NODES, [2, 2])
    assert [r.returncode for r in runs] == [1, 1]  # torchrun's agent reports its failed workers with 1
    for r in runs:
        # the host's vendor (cpu here, which both chip types map to) is named where entries run on it
        assert re.search(r"field 'node 1': 2 processes(, vendor '\w+')?: no node of the run's list left", r.stdout), \
            r.stdout[-2000:]
        assert "node 0: A with 1 process (plan ranks [2]), node 1: A with 2 processes (plan ranks [0, 1])" \
            in r.stdout
    assert not any("heteropp/engine/" in r.stdout for r in runs)  # no frame of the engine's


@pytest.mark.parametrize("env, seen, says", [
    ({"GROUP_RANK": "0", "LOCAL_RANK": "0", "GROUP_WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"},
     {0: (None, 2), 1: (None, 2)}, "node 1'?: 2 processes: no node of the run's list left"),
    ({"GROUP_RANK": "0", "LOCAL_RANK": "0", "GROUP_WORLD_SIZE": "3", "LOCAL_WORLD_SIZE": "1"},
     {0: (None, 1), 1: (None, 2), 2: (None, 1)}, "--nnodes.*3 nodes joined.*the run's 2"),
])
def test_a_launch_that_differs_from_the_nodes_is_refused_naming_the_node(env, seen, says):
    """torchrun's environment for node 0 when both nodes run two processes, and when a third node joined."""
    with pytest.raises(SpecError, match=says):
        torchrun_rank(PLAN, NODES, env, seen)


@pytest.mark.parametrize("env, says", [
    ({"RANK": "0", "WORLD_SIZE": "3"}, "GROUP_RANK.*not set.*a launch by torchrun"),
    ({"GROUP_RANK": "1", "LOCAL_RANK": "-1", "GROUP_WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"},
     "node 1 LOCAL_RANK.*got -1.*0 to 1"),
    ({"GROUP_RANK": "1", "LOCAL_RANK": "0", "GROUP_WORLD_SIZE": "two", "LOCAL_WORLD_SIZE": "2"},
     "GROUP_WORLD_SIZE.*got 'two'.*an integer"),
])
def test_a_launch_environment_that_is_not_torchrun_s_is_refused(env, says):
    """A config that lists its nodes started by another launcher (no GROUP_RANK: its RANK ignores the node
    rule), a local rank outside the node's, a size that is not a number."""
    with pytest.raises(SpecError, match=says):
        torchrun_rank(PLAN, NODES, env, {0: (None, 1), 1: (None, 2)})


def test_a_host_whose_chip_type_is_no_nodes_is_refused():
    """A two-process host that says its chip type (HETEROPP_CHIP): B is the list's two-chip node, A is not."""
    env = {"GROUP_RANK": "1", "LOCAL_RANK": "0", "GROUP_WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
    plan = Plan([StagePlan("A", 1, 2), StagePlan("B", 2, 2, first_layer=2)], dp=1, micro_batch_size=1,
                micro_batches=2, num_layers=MODEL.layers)
    nodes = [["A", 1], ["B", 2]]
    assert torchrun_rank(plan, nodes, env, {0: (None, 1), 1: ("B", 2)}) == 1
    with pytest.raises(SpecError, match="node 1'?: 2 processes, HETEROPP_CHIP 'A': no node of the run's list"):
        torchrun_rank(plan, nodes, env, {0: (None, 1), 1: ("A", 2)})


def test_a_tp_group_that_fits_no_listed_node_is_refused_naming_the_stage():
    with pytest.raises(SpecError, match=r"stages\[0\]\.tp"):
        ranks_by_node(PLAN, [["A", 1], ["A", 1], ["A", 1]])


def test_write_config_with_the_cluster_lists_the_nodes_and_each_nodes_command(tmp_path, capsys):
    """`heteropp run --write-config --cluster`: the config carries the nodes the plan uses, in the cluster's
    order, and each node's torchrun command starts as many workers as the node rule puts there."""
    from heteropp.cli import main
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("chips:\n  - {name: A, nodes: [1, 2, 2], memory_gb: 4, peak_tflops: 1, intra_node_bw: 5, "
                       "network_bw: 2, device: cpu, device_name: '*EPYC*'}\n")
    PLAN.save(tmp_path / "plan.json")
    model = tmp_path / "model.json"
    model.write_text(json.dumps({k: v for k, v in RunConfig.model_dict(MODEL).items() if k != "explicit_head_dim"}))
    out = tmp_path / "run.json"
    assert main(["run", "--plan", str(tmp_path / "plan.json"), "--model", str(model), "--steps", "1",
                 "--cluster", str(cluster), "--write-config", str(out)]) == 0, capsys.readouterr().err
    # by hand: the TP-2 group takes the first two-chip node, the TP-1 stage the one-chip node; one node idle
    written = json.loads(out.read_text())
    assert written["nodes"] == [["A", 1], ["A", 2]]
    assert written["device_names"] == {"A": "*EPYC*"}  # the spec's pattern, for the workers' matching
    said = capsys.readouterr().out
    assert "--nnodes=2 --node-rank=0 --nproc-per-node=1" in said
    assert "--nnodes=2 --node-rank=1 --nproc-per-node=2" in said


# Replica groups: A runs all 4 layers on one chip (rank 0), B cuts them 1|3 over two chips (ranks 1 and 2).
# Node 0 holds two B chips, node 1 one A chip: torchrun alone gives node 0's workers ranks 0 and 1, an A stage
# on a B host and B's pipeline split over the two hosts.
GROUPS = Plan.of_replicas([ReplicaGroup([StagePlan("A", 1, 4)], 2),
                           ReplicaGroup([StagePlan("B", 1, 1), StagePlan("B", 1, 3)], 3)], 1, schedule="1f1b",
                          num_layers=MODEL.layers)
GROUP_NODES = [["B", 2], ["A", 1]]
_CHIP_LINE = re.compile(r"rank (\d+): stage \d+ \((\w+), ")


def test_the_node_rule_places_replica_groups_by_hand():
    """Every group's stages on nodes of their chip type: B's ranks 1 and 2 on node 0, A's rank 0 on node 1.
    Every group's TP groups are placed before any group's TP-1 stages, as for one stage list."""
    assert ranks_by_node(GROUPS, GROUP_NODES) == [[1, 2], [0]]
    tp = Plan.of_replicas([ReplicaGroup([StagePlan("A", 2, 2), StagePlan("A", 1, 2)], 2),  # ranks 0-1, 2
                           ReplicaGroup([StagePlan("A", 2, 2), StagePlan("A", 1, 2)], 2)], 1,  # ranks 3-4, 5
                          schedule="1f1b", num_layers=MODEL.layers)
    # nodes of 2 and 4 chips: both TP-2 groups first, each into the fullest node it fits (the first fills node
    # 0, the second goes to node 1), then the TP-1 ranks 2 and 5 into the only node with room (node 1)
    assert ranks_by_node(tp, [["A", 2], ["A", 4]]) == [[0, 1], [2, 3, 4, 5]]


def test_under_torchrun_replica_groups_run_on_nodes_of_their_chip_type(tmp_path):
    runs = _launch(tmp_path, GROUP_NODES, [2, 1], GROUPS)
    for r in runs:
        assert r.returncode == 0, r.stdout[-3000:]
    chips = [sorted(m.group(2) for m in _CHIP_LINE.finditer(r.stdout)) for r in runs]
    assert chips == [["B", "B"], ["A"]]
    losses = [json.loads(line)["loss"] for line in (tmp_path / "loss.jsonl").read_text().splitlines()]
    check_losses(losses, reference(GROUPS.global_batch)["losses"][:STEPS], "replica groups by node")


def test_a_launch_of_replica_groups_that_differs_from_the_nodes_is_refused_naming_the_node():
    env = {"GROUP_RANK": "1", "LOCAL_RANK": "0", "GROUP_WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
    with pytest.raises(SpecError, match="node 1'?: 2 processes: no node of the run's list left.*node 1: A with 1 "
                                        "process \\(plan ranks \\[0\\]\\)"):
        torchrun_rank(GROUPS, GROUP_NODES, env, {0: (None, 2), 1: (None, 2)})
    with pytest.raises(SpecError, match=r"replicas\[1\]\.stages\[0\]\.chip.*'B' has no node"):
        ranks_by_node(GROUPS, [["A", 3]])


def test_write_config_with_the_cluster_places_a_plan_of_replica_groups_by_node(tmp_path, capsys):
    """The config lists the nodes a plan of replica groups uses and each node's command its process count
    (before, it listed none and said the workers kept torchrun's numbering)."""
    from heteropp.cli import main
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("chips:\n"
                       "  - {name: A, nodes: [1, 1], memory_gb: 16, peak_tflops: 1, intra_node_bw: 5, network_bw: 2, "
                       "device: cpu}\n"
                       "  - {name: B, nodes: [2], memory_gb: 16, peak_tflops: 1, intra_node_bw: 5, network_bw: 2, "
                       "device: cpu}\n")
    GROUPS.save(tmp_path / "plan.json")
    model = tmp_path / "model.json"
    model.write_text(json.dumps({k: v for k, v in RunConfig.model_dict(MODEL).items() if k != "explicit_head_dim"}))
    out = tmp_path / "run.json"
    assert main(["run", "--plan", str(tmp_path / "plan.json"), "--model", str(model), "--cluster", str(cluster),
                 "--write-config", str(out)]) == 0
    # by hand: A's one rank on the first A node (the second idle), B's two ranks on the B node
    assert json.loads(out.read_text())["nodes"] == [["A", 1], ["B", 2]]
    said = capsys.readouterr()
    assert "HETEROPP_CHIP=A torchrun --nnodes=2 --node-rank=0 --nproc-per-node=1" in said.out
    assert "HETEROPP_CHIP=B torchrun --nnodes=2 --node-rank=1 --nproc-per-node=2" in said.out
    assert "not placed by node" not in said.err
