"""Under a c10d rendezvous (what clusters and the elastic launcher use), torchrun's GROUP_RANK follows the
order nodes join, not the run config's node list; which entry of the list a node is must follow what the node
is: its chip type (HETEROPP_CHIP) and its process count (heteropp/engine/node_ranks.match_nodes, fed by
node_gather.py over the rendezvous store). Two real torchrun agents on loopback with --rdzv-backend=c10d: the
list says node 0 is one A chip, node 1 two B chips, but the B host joins as group rank 0 (the rendezvous ranks
nodes by address: B's agent is on 127.0.0.1, A's on 127.0.0.2). Before, the B host's workers were refused
("2 processes on node 0"); now each host runs its own chip type's stage and the loss is the single-process
reference's. The matching itself is checked against answers derived by hand."""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import uuid

import pytest

from heteropp.engine import RunConfig
from heteropp.engine.node_ranks import match_nodes, torchrun_rank, unsure_nodes
from heteropp.plan import Plan, StagePlan
from heteropp.spec.errors import SpecError
from tests.heteropp.heteropp_helpers import MODEL, check_losses, reference
from .long_tests import long_test

STEPS = 2
# A: layers 0-1 on one chip (plan rank 0); B: layers 2-3 at TP 2 (plan ranks 1 and 2)
PLAN = Plan([StagePlan("A", 1, 2), StagePlan("B", 2, 2, first_layer=2)], dp=1, micro_batch_size=1,
            micro_batches=2, num_layers=MODEL.layers)
NODES = [["A", 1], ["B", 2]]
_CHIP_LINE = re.compile(r"rank (\d+): stage (\d+) \((\w+), ")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch_c10d(tmp_path, hosts: list[tuple[str, str | None, int]]) -> list[subprocess.CompletedProcess]:
    """One torchrun agent per host (addr, HETEROPP_CHIP or None, processes), c10d rendezvous on loopback, the
    first host holding the store and started first."""
    cfg = RunConfig(plan=PLAN.to_dict(), model=RunConfig.model_dict(MODEL), steps=STEPS, backend="gloo",
                    chip_map={"A": "cpu", "B": "cpu"}, timeout_s=60, verbose=True,
                    loss_log=str(tmp_path / "loss.jsonl"), nodes=NODES)
    path = tmp_path / "run.json"
    path.write_text(json.dumps(cfg.__dict__))
    port, run_id = _port(), uuid.uuid4().hex[:8]
    agents = []
    for i, (addr, chip, n) in enumerate(hosts):
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        env.pop("HETEROPP_CHIP", None)
        if chip is not None:
            env["HETEROPP_CHIP"] = chip
        agents.append(subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", f"--nnodes={len(hosts)}", f"--nproc-per-node={n}",
             "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={run_id}",
             f"--rdzv-conf=is_host={'true' if i == 0 else 'false'}", f"--local-addr={addr}", "--max-restarts=0",
             "-m", "heteropp.engine.worker", "--config", str(path)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    out = []
    for a in agents:
        text, _ = a.communicate(timeout=300)
        out.append(subprocess.CompletedProcess(a.args, a.returncode, text))
    return out


def test_under_a_c10d_rendezvous_a_b_node_that_joins_first_runs_the_b_stage(tmp_path):
    runs = _launch_c10d(tmp_path, [("127.0.0.1", "B", 2), ("127.0.0.2", "A", 1)])
    for r in runs:
        assert r.returncode == 0, r.stdout[-3000:]
        assert "heteropp worker: warning" not in r.stdout  # both hosts say their chip type
    # by hand: the B host takes plan ranks 1 and 2 (stage 1), the A host plan rank 0 (stage 0)
    got = [sorted((int(m.group(1)), int(m.group(2)), m.group(3)) for m in _CHIP_LINE.finditer(r.stdout))
           for r in runs]
    assert got == [[(1, 1, "B"), (2, 1, "B")], [(0, 0, "A")]]
    losses = [json.loads(line)["loss"] for line in (tmp_path / "loss.jsonl").read_text().splitlines()]
    check_losses(losses, reference(PLAN.global_batch)["losses"][:STEPS], "c10d rendezvous, B first")


# Nodes of one chip type and different sizes: the TP-2 stage's ranks 0-1 need the two-chip node, rank 2 the
# one-chip node (test_heteropp_torchrun_nodes.py derives it).
TP_PLAN = Plan([StagePlan("A", 2, 2), StagePlan("A", 1, 2, first_layer=2)], dp=1, micro_batch_size=1,
               micro_batches=2, num_layers=MODEL.layers)


@pytest.mark.parametrize("plan, nodes, seen, want", [
    # the launch's own numbering where every node fits it (a static rendezvous with the right --node-rank)
    (PLAN, NODES, {0: ("A", 1), 1: ("B", 2)}, {0: 0, 1: 1}),
    (PLAN, NODES, {0: (None, 1), 1: (None, 2)}, {0: 0, 1: 1}),
    # the B host arrived first: by its chip type, by its process count, by both
    (PLAN, NODES, {0: ("B", 2), 1: ("A", 1)}, {0: 1, 1: 0}),
    (PLAN, NODES, {0: (None, 2), 1: (None, 1)}, {0: 1, 1: 0}),
    (PLAN, NODES, {0: ("B", 2), 1: (None, 1)}, {0: 1, 1: 0}),
    # one chip type, nodes of 1 and 2 chips, the two-chip node first
    (TP_PLAN, [["A", 1], ["A", 2]], {0: (None, 2), 1: (None, 1)}, {0: 1, 1: 0}),
    # two one-chip nodes, A and B: the host that says B gets the B entry although a silent host came first
    (Plan([StagePlan("A", 1, 2), StagePlan("B", 1, 2, first_layer=2)], dp=1, micro_batch_size=1,
          micro_batches=2, num_layers=MODEL.layers), [["B", 1], ["A", 1]], {0: (None, 1), 1: ("B", 1)},
     {1: 0, 0: 1}),
])
def test_nodes_are_matched_to_the_list_by_what_they_are(plan, nodes, seen, want):
    assert match_nodes(plan, nodes, seen) == want


def test_the_rank_follows_the_matched_node():
    """The B host, group rank 0, local rank 1: plan rank 2 (B's second TP rank), by hand."""
    env = {"GROUP_RANK": "0", "LOCAL_RANK": "1", "GROUP_WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
    assert torchrun_rank(PLAN, NODES, env, {0: ("B", 2), 1: ("A", 1)}) == 2


@pytest.mark.parametrize("seen, says", [
    # a B host with one process: no B entry of one process
    ({0: ("B", 1), 1: ("A", 1)}, r"node 0.*1 processes, HETEROPP_CHIP 'B': no node of the run's list left"),
    # two hosts that both say A
    ({0: ("A", 1), 1: ("A", 2)}, r"node 1.*2 processes, HETEROPP_CHIP 'A'"),
    # silent hosts of two processes each: the second finds no entry of two processes left
    ({0: (None, 2), 1: (None, 2)}, r"node 1'?: 2 processes: no node.*says its chip type"),
    # a node missing from what the store gathered
    ({0: ("A", 1)}, r"GROUP_RANK.*nodes \[0\] joined.*nodes 0 to 1"),
])
def test_a_launch_that_matches_no_reading_of_the_list_is_refused_naming_the_node(seen, says):
    with pytest.raises(SpecError, match=says):
        match_nodes(PLAN, NODES, seen)


def test_a_host_that_could_be_either_chip_type_is_named():
    """Two one-process nodes of types A and B: a host that does not say its chip type could be either (which it
    runs rests on its group rank); one that says it, or one whose process count only one type has, is sure."""
    plan = Plan([StagePlan("A", 1, 2), StagePlan("B", 1, 2, first_layer=2)], dp=1, micro_batch_size=1,
                micro_batches=2, num_layers=MODEL.layers)
    assert unsure_nodes(plan, [["A", 1], ["B", 1]], {0: (None, 1), 1: ("B", 1)}) == {0: ["A", "B"]}
    assert unsure_nodes(plan, [["A", 1], ["B", 1]], {0: ("A", 1), 1: ("B", 1)}) == {}
    assert unsure_nodes(PLAN, NODES, {0: (None, 2), 1: (None, 1)}) == {}


def _store_env(monkeypatch, round_: int = 0) -> tuple[object, dict[str, str]]:
    """A real TCPStore standing in for torchrun's agent store, and node 0's (of 2) worker environment."""
    import torch.distributed as dist
    port = _port()
    server = dist.TCPStore("127.0.0.1", port, 2, is_master=True, wait_for_workers=False)
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0", "WORLD_SIZE": "2",
           "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": str(round_), "GROUP_RANK": "0",
           "GROUP_WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "HETEROPP_CHIP": "A"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)  # torch's env:// rendezvous reads the process environment
    return server, env


def test_the_nodes_read_what_each_node_wrote_to_the_store_for_this_round(monkeypatch):
    """On the agent's store, which outlives the round, the keys are scoped by the restart count."""
    import datetime

    from heteropp.engine.node_gather import gather_nodes
    server, env = _store_env(monkeypatch, round_=1)
    server.set("heteropp/nodes/0/1", '["A", 9]')  # the previous round's node 1: not read
    server.set("heteropp/nodes/1/1", '["B", 2]')
    _, seen = gather_nodes(env, 0, 2, datetime.timedelta(seconds=10))
    assert seen == {0: ("A", 1, None, None), 1: ("B", 2, None, None)}  # saying their chip type: no vendor, name


def test_a_node_at_another_restart_count_on_the_agents_store_is_named_with_the_setting(monkeypatch):
    """Node 1's agent did not count the restart (it restarted for the membership change): on the shared store
    the wait cannot end, and the error says why and what to set."""
    import datetime

    from heteropp.engine.node_gather import gather_nodes
    server, env = _store_env(monkeypatch, round_=1)
    server.set("heteropp/nodes/0/1", '["B", 2]')
    with pytest.raises(SpecError, match=r"node 1'?: wrote nothing .* under restart 0, this worker is at restart 1 "
                                        r".*TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"):
        gather_nodes({**env, "TORCHELASTIC_MAX_RESTARTS": "3"}, 0, 2, datetime.timedelta(seconds=1))


@pytest.mark.parametrize("raw", [b"garbage", b'["B", 0]', b'[3, 2]', b'["B"]', b'["B", true]'])
def test_what_another_node_wrote_is_checked_and_refused_naming_the_node(monkeypatch, raw):
    import datetime

    from heteropp.engine.node_gather import gather_nodes
    server, env = _store_env(monkeypatch)
    server.set("heteropp/nodes/0/1", raw)
    with pytest.raises(SpecError, match=r"node 1'?: told the store .*expected \[chip type or null, processes >= 1, "
                                        r"vendor or null, device name or null\]"):
        gather_nodes(env, 0, 2, datetime.timedelta(seconds=10))


def _gather_as_nodes(monkeypatch, restarts: list[str], timeout_s: float = 20) -> list[object]:
    """gather_nodes run by each node's worker (one process each, threads here) of a fresh-store launch
    (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: rank 0 hosts the round's store), node g at restart count
    restarts[g]; each thread's answer, or the exception it raised."""
    import datetime
    import threading

    from heteropp.engine.node_gather import gather_nodes
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(_port()))
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "False")
    out: list[object] = [None] * len(restarts)
    # Each node's store is kept until every node is done, as a worker keeps it (init_process_group takes it):
    # node 0's store hosts the round's server, and node 1 may still be reading from it when node 0 returns.
    stores: list[object] = []

    def node(g: int) -> None:
        env = {"TORCHELASTIC_RESTART_COUNT": restarts[g], "GROUP_RANK": str(g), "GROUP_WORLD_SIZE": "2",
               "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": str(g + 1), "HETEROPP_CHIP": "AB"[g]}
        try:
            store, out[g] = gather_nodes(env, g, 2, datetime.timedelta(seconds=timeout_s))
            stores.append(store)
        except Exception as e:  # noqa: BLE001  the test reads it
            out[g] = e
    threads = [threading.Thread(target=node, args=(g,)) for g in range(len(restarts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_nodes_whose_agents_counted_different_restarts_still_meet(monkeypatch):
    """A worker of node 1 failed and its agent restarted the group (restart count 1); node 0's agent restarted
    for the membership change, which torchelastic does not count (restart count 0). The round's store is
    fresh, so both nodes must meet whatever their counts (before: each waited for the other's key under its
    own count, until the timeout)."""
    seen = _gather_as_nodes(monkeypatch, ["0", "1"], timeout_s=5)
    assert seen == [{0: ("A", 1, None, None), 1: ("B", 2, None, None)}] * 2


def test_a_worker_that_never_reaches_a_fresh_store_is_a_clear_error(monkeypatch):
    """Node 1's worker never connects to the store node 0's worker hosts (before: torch's store error)."""
    (e,) = _gather_as_nodes(monkeypatch, ["0"], timeout_s=1)
    assert isinstance(e, SpecError) and re.search(r"WORLD_SIZE'?: not every one of the 2 workers", str(e)), e


def test_a_node_that_never_says_what_it_is_is_named(monkeypatch):
    """Node 1's workers reached the store but never wrote (died first): node 0 is told which node is missing
    (before: torch's store timeout, naming a key)."""
    import datetime

    from heteropp.engine.node_gather import gather_nodes
    _server, env = _store_env(monkeypatch)
    with pytest.raises(SpecError, match=r"node 1'?: wrote nothing .* within 1"):
        gather_nodes(env, 0, 2, datetime.timedelta(seconds=1))


_RESTARTED = '''
import datetime, os, sys, time
from heteropp.engine.node_gather import gather_nodes
count = os.environ["TORCHELASTIC_RESTART_COUNT"]
_, seen = gather_nodes(os.environ, int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]),
                       datetime.timedelta(seconds=20))
print(f"node {os.environ['GROUP_RANK']} restart {count} seen {sorted((g, tuple(s)) for g, s in seen.items())}",
      flush=True)
if count == "0":  # node B's worker fails; node A's still runs when B's agent comes back to the rendezvous
    sys.exit(3) if os.environ["HETEROPP_CHIP"] == "B" else time.sleep(30)
'''


@long_test("~50 s")
def test_after_one_nodes_worker_fails_the_restarted_round_meets(tmp_path):
    """Two real c10d agents, a fresh store per round: node B's worker exits, its agent counts a restart (1);
    node A's agent restarts for the membership change and does not (0). Both nodes' new workers must still
    read each other (before: each waited for keys under its own count until the timeout)."""
    script = tmp_path / "gather.py"
    script.write_text(_RESTARTED)
    port, run_id = _port(), uuid.uuid4().hex[:8]
    agents = []
    for i, (addr, chip) in enumerate([("127.0.0.1", "A"), ("127.0.0.2", "B")]):
        env = {**os.environ, "OMP_NUM_THREADS": "1", "HETEROPP_CHIP": chip, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
               "PYTHONPATH": os.pathsep.join(sys.path)}
        agents.append(subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1",
             "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={run_id}",
             f"--rdzv-conf=is_host={'true' if i == 0 else 'false'}", f"--local-addr={addr}", "--max-restarts=1",
             "--monitor-interval=0.5", str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True))
    outs = [a.communicate(timeout=120)[0] for a in agents]
    both = "[(0, ('A', 1, None, None)), (1, ('B', 1, None, None))]"
    assert f"node 0 restart 0 seen {both}" in outs[0] and f"node 1 restart 1 seen {both}" in outs[1], outs
    assert all(a.returncode == 0 for a in agents), outs
