"""Which plan rank a worker started by torchrun takes, so that ranks follow the node rule.

torchrun numbers a run's workers node by node in rendezvous order (RANK), knowing nothing of the plan; the
plan numbers its ranks stage by stage (topology.py). Left at that, a TP group placed inside one node by the
node rule (spec/placement.py: the cost model, the brute force and `run --cluster` assume it) could run on
ranks of two hosts. A run config that lists its nodes (RunConfig.nodes: chip type and chips per node, in
node-rank order, as `heteropp run --write-config --cluster` writes them) makes every worker take, from
torchrun's GROUP_RANK and LOCAL_RANK, the plan rank the node rule puts on its node; a launch whose nodes
differ from the list (node count, processes on a node) is refused, naming the node, before any group forms.
"""
from __future__ import annotations

from typing import Mapping, Sequence

from ..plan import Plan
from ..spec.errors import SpecError


def ranks_by_node(plan: Plan, nodes: Sequence[Sequence[object]]) -> list[list[int]]:
    """Per node of `nodes` ((chip type, chips), in node-rank order), the plan ranks the node rule puts on it,
    ascending. A plan of replica groups is placed as one: every group's stages together (Plan.placement), each
    group's ranks after the groups' before it (replica_groups.py). SpecError naming the node list when a
    stage's chip type has no node there, or a TP group fits in none."""
    sizes: dict[str, list[int]] = {}
    where: dict[tuple[str, int], int] = {}  # (chip type, its j-th node) -> index in `nodes`
    for i, node in enumerate(nodes):
        chip, n = node
        if not isinstance(chip, str) or not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise SpecError("nodes", f"nodes[{i}]", f"got {list(node)!r}", "[chip type, chips >= 1]")
        where[(chip, len(sizes.setdefault(chip, [])))] = i
        sizes[chip].append(n)
    for name, s in plan.stage_names():
        if s.chip not in sizes:
            raise SpecError("nodes", f"{name}.chip", f"{s.chip!r} has no node in the list",
                            "a node of every chip type the plan uses")
    placed = iter(plan.placement(sizes, "nodes"))  # every group's stages in turn, as Plan.placement lists them
    out: list[list[int]] = [[] for _ in nodes]
    base = 0
    for g in plan.groups:
        offsets = g.rank_offsets()
        for k in range(g.devices):
            chip, tp = g.stages[k].chip, g.stages[k].tp
            for replica, j in enumerate(next(placed)):
                first = base + offsets[k] + replica * tp
                out[where[(chip, j)]] += range(first, first + tp)
        base += g.world_size
    return [sorted(r) for r in out]


def torchrun_rank(plan: Plan, nodes: Sequence[Sequence[object]], env: Mapping[str, str]) -> int:
    """This worker's plan rank from torchrun's environment (GROUP_RANK: the node, LOCAL_RANK: the process on
    it, GROUP_WORLD_SIZE and LOCAL_WORLD_SIZE; HETEROPP_CHIP, when the host sets it, its chip type); SpecError
    naming the node when the launch differs from `nodes`."""
    per_node = ranks_by_node(plan, nodes)
    node, local = _env_int(env, "GROUP_RANK"), _env_int(env, "LOCAL_RANK")
    count, procs = _env_int(env, "GROUP_WORLD_SIZE"), _env_int(env, "LOCAL_WORLD_SIZE")
    layout = ", ".join(f"node {i}: {len(r)} x {nodes[i][0]}" for i, r in enumerate(per_node))
    if count != len(nodes):
        raise SpecError("torchrun", "--nnodes", f"{count} nodes joined", f"the run's {len(nodes)} ({layout})")
    if not 0 <= node < len(nodes):
        raise SpecError("torchrun", "GROUP_RANK", f"got {node}", f"a node of the run's {len(nodes)} ({layout})")
    chip = env.get("HETEROPP_CHIP")  # the host's own chip type, where it says (as `--elastic` hosts do)
    if chip is not None and chip != nodes[node][0]:
        raise SpecError("torchrun", f"node {node} HETEROPP_CHIP", f"this host says {chip!r}, node {node} of the "
                        f"run is a {nodes[node][0]!r} node", f"the host of node {node} started with --node-rank "
                        f"{node} ({layout})")
    want = len(per_node[node])
    if procs != want:
        raise SpecError("torchrun", f"node {node} --nproc-per-node", f"{procs} processes on node {node}",
                        f"{want}: the plan ranks {per_node[node]}, which the node rule puts on node {node} "
                        f"({nodes[node][1]} {nodes[node][0]} chips; the run's nodes: {layout}); start node i "
                        "with --node-rank i and its count of processes")
    if not 0 <= local < want:
        raise SpecError("torchrun", f"node {node} LOCAL_RANK", f"got {local}", f"0 to {want - 1}")
    return per_node[node][local]


def _env_int(env: Mapping[str, str], name: str) -> int:
    """torchrun's variable `name` as an integer; SpecError when it is missing (a launcher other than torchrun,
    whose ranks would not follow the node rule) or not an integer."""
    value = env.get(name)
    if value is None:
        raise SpecError("torchrun", name, "not set", "a launch by torchrun, which sets GROUP_RANK, LOCAL_RANK, "
                        "GROUP_WORLD_SIZE and LOCAL_WORLD_SIZE (the run config lists its nodes)")
    try:
        return int(value)
    except ValueError:
        raise SpecError("torchrun", name, f"got {value!r}", "an integer") from None


def launch_nodes(plan: Plan, nodes: Sequence[Sequence[object]]) -> list[list[object]]:
    """The nodes of `nodes` ((chip type, chips), the cluster's, in its order) the node rule puts ranks on, each
    as [chip type, chips]: RunConfig.nodes for a torchrun launch (a node left idle starts no agent)."""
    per_node = ranks_by_node(plan, nodes)
    return [[node[0], node[1]] for node, ranks in zip(nodes, per_node) if ranks]
