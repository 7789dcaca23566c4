"""Which plan rank a worker started by torchrun takes, so that ranks follow the node rule.

torchrun numbers a run's workers node by node in rendezvous order (RANK), knowing nothing of the plan; the
plan numbers its ranks stage by stage (topology.py). Left at that, a TP group placed inside one node by the
node rule (spec/placement.py: the cost model, the brute force and `run --cluster` assume it) could run on
ranks of two hosts. A run config that lists its nodes (RunConfig.nodes: chip type and chips per node, as
`heteropp run --write-config --cluster` writes them) makes every worker take the plan rank the node rule puts
on its node. Which list entry a node is follows what the node is (its process count, and its chip type where
the host says it, else its vendor and the name its device reports), not torchrun's GROUP_RANK alone: under a
c10d rendezvous GROUP_RANK is arrival order. The nodes tell each other what they are over the rendezvous store
before any group forms (node_gather.py); a launch that matches no reading of the list is refused, naming the
node.
"""
from __future__ import annotations

import collections
from typing import Mapping, NamedTuple, Sequence

from ..plan import Plan
from ..spec.errors import SpecError
from .device_match import name_matches


class Seen(NamedTuple):
    """What one node of a torchrun launch says it is (node_gather.py): its chip type where its host sets
    HETEROPP_CHIP, its process count, and where HETEROPP_CHIP is unset the ditorch vendor its host chose and the
    name its device reports (None where unknown: a node of a version that did not say it)."""
    chip: str | None
    procs: int
    vendor: str | None = None
    device: str | None = None


def _as_seen(seen: Mapping[int, Sequence[object]]) -> dict[int, Seen]:
    return {g: Seen(*s) for g, s in seen.items()}


def entry_vendors(nodes: Sequence[Sequence[object]], chip_map: Mapping[str, str] | None) -> list[str | None]:
    """Per entry of `nodes`, the name of the ditorch adapter its chip type runs on (RunConfig.chip_map, else
    the type's own name); None where it maps to none (the stage says so when it starts) or no map is given."""
    if chip_map is None:
        return [None] * len(nodes)
    from .topology import resolve_chip  # imports ditorch: only inside a worker, never in the fork server

    def vendor(chip: object) -> str | None:
        try:
            return resolve_chip(str(chip), dict(chip_map)).name
        except ValueError:
            return None
    return [vendor(n[0]) for n in nodes]


class _Entries(NamedTuple):
    """Per entry of the node list: the ditorch vendor its chip type runs on and its type's device name pattern
    (None: unknown, or none given)."""
    vendors: list[str | None]
    patterns: list[str | None]

    @staticmethod
    def of(nodes: Sequence[Sequence[object]], chip_map: Mapping[str, str] | None,
           device_names: Mapping[str, str] | None) -> "_Entries":
        names = device_names or {}
        return _Entries(entry_vendors(nodes, chip_map), [names.get(str(n[0])) for n in nodes])

    def by_name(self, node: Seen) -> bool:
        """Whether a host that does not say its chip type is held to the entries whose pattern its device name
        fits: only where some entry's does."""
        return node.chip is None and any(name_matches(p, node.device) for p in self.patterns)

    def by_vendor(self, node: Seen) -> bool:
        """Whether such a host is held to the entries of its vendor: only where some entry's chip type runs on
        that vendor (else its process count alone places it, as before vendors)."""
        return node.chip is None and node.vendor is not None and node.vendor in self.vendors

    def allow(self, node: Seen, entry: int) -> bool:
        return (not self.by_vendor(node) or self.vendors[entry] == node.vendor) and \
            (not self.by_name(node) or name_matches(self.patterns[entry], node.device))


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


def torchrun_rank(plan: Plan, nodes: Sequence[Sequence[object]], env: Mapping[str, str],
                  seen: Mapping[int, Sequence[object]], chip_map: Mapping[str, str] | None = None,
                  device_names: Mapping[str, str] | None = None) -> int:
    """This worker's plan rank from torchrun's environment (GROUP_RANK: its node, LOCAL_RANK: the process on
    it, GROUP_WORLD_SIZE and LOCAL_WORLD_SIZE) and what every node of the launch is (`seen`: per GROUP_RANK,
    its chip type where its host says it (HETEROPP_CHIP), its count of processes, its host's vendor and device
    name, gathered before any group forms, node_gather.py; `chip_map`: RunConfig.chip_map; `device_names`:
    RunConfig.device_names). Under a c10d rendezvous
    GROUP_RANK follows arrival order, not the list: nodes are matched to list entries by what they are
    (match_nodes); SpecError naming the node when the launch matches no reading of `nodes`."""
    per_node = ranks_by_node(plan, nodes)
    node, local = env_int(env, "GROUP_RANK"), env_int(env, "LOCAL_RANK")
    count, procs = env_int(env, "GROUP_WORLD_SIZE"), env_int(env, "LOCAL_WORLD_SIZE")
    layout = _layout(nodes, per_node)
    if count != len(nodes):
        raise SpecError("torchrun", "--nnodes", f"{count} nodes joined", f"the run's {len(nodes)} ({layout})")
    if not 0 <= node < len(nodes):
        raise SpecError("torchrun", "GROUP_RANK", f"got {node}", f"a node of the run's {len(nodes)} ({layout})")
    if not 0 <= local < procs:
        raise SpecError("torchrun", f"node {node} LOCAL_RANK", f"got {local}", f"0 to {procs - 1}")
    entry = match_nodes(plan, nodes, seen, chip_map, device_names)[node]
    return per_node[entry][local]


def match_nodes(plan: Plan, nodes: Sequence[Sequence[object]], seen: Mapping[int, Sequence[object]],
                chip_map: Mapping[str, str] | None = None,
                device_names: Mapping[str, str] | None = None) -> dict[int, int]:
    """Which entry of `nodes` each node of the launch is: {GROUP_RANK: index in `nodes`}. A node fits an entry
    when its process count is the count of ranks the node rule puts there and, where its host says its chip
    type, the types agree; a host that does not say it fits only entries whose chip type runs on its vendor
    (`chip_map`), where any does, and only entries whose type's device name pattern (`device_names`) its
    device's name fits, where any does. Every worker computes the same answer from the same `seen`: the
    launch's own numbering when every node fits its entry (a static rendezvous started with the right
    --node-rank), else nodes that say their chip type first, then those their device name places, then those
    their vendor places, then the others, each taking, in GROUP_RANK order, the first free entry it fits, or
    one freed by moving nodes placed before it to other entries they fit (_augment), so this finds a matching
    whenever one exists; SpecError naming the node left without one."""
    per_node = ranks_by_node(plan, nodes)
    want = [(str(n[0]), len(r)) for n, r in zip(nodes, per_node)]
    seen, entries = _as_seen(seen), _Entries.of(nodes, chip_map, device_names)
    if sorted(seen) != list(range(len(nodes))):
        raise SpecError("torchrun", "GROUP_RANK", f"nodes {sorted(seen)} joined",
                        f"nodes 0 to {len(nodes) - 1}, the run's {len(nodes)} ({_layout(nodes, per_node)})")

    def fits(g: int, i: int) -> bool:
        node = seen[g]
        return node.procs == want[i][1] and node.chip in (None, want[i][0]) and entries.allow(node, i)

    if all(fits(g, g) for g in seen):
        return {g: g for g in seen}
    fitting = {g: [i for i in range(len(nodes)) if fits(g, i)] for g in seen}
    out: dict[int, int] = {}
    owner: dict[int, int] = {}  # entry -> node
    for g in sorted(seen, key=lambda g: (seen[g].chip is None, not entries.by_name(seen[g]),
                                         not entries.by_vendor(seen[g]), g)):
        if not _augment(g, fitting, out, owner):
            chip, procs, vendor, device = seen[g]
            says = f"{procs} processes" + (f", HETEROPP_CHIP {chip!r}" if chip is not None else "") + \
                (f", vendor {vendor!r}" if entries.by_vendor(seen[g]) else "") + \
                (f", device {device!r}" if entries.by_name(seen[g]) else "")
            hint = "" if chip else "; a host that says its chip type (HETEROPP_CHIP) is matched by it"
            raise SpecError("torchrun", f"node {g}", f"{says}: no node of the run's list left that it can be",
                            f"every host one of the run's nodes, started with the processes the node rule puts "
                            f"there ({_layout(nodes, per_node)}){hint}")
    return out


def _augment(g: int, fitting: Mapping[int, Sequence[int]], out: dict[int, int], owner: dict[int, int]) -> bool:
    """Gives node g an entry (`out`: node -> entry, `owner` its inverse), moving nodes already placed to other
    entries they fit where that frees one (the shortest such chain, found breadth first): the first free entry g
    fits when there is one. False where no chain exists, i.e. no matching places g with the nodes before it.
    Name and vendor narrow nodes to sets that may overlap (two patterns one name fits), where taking the first
    free entry alone can strand a later node although a matching exists."""
    reached: dict[int, int] = {}  # entry -> the node whose chain reached it
    queue, queued = collections.deque([g]), {g}
    while queue:
        u = queue.popleft()
        for i in fitting[u]:
            if i in reached:
                continue
            reached[i] = u
            if i not in owner:  # free: move each node along the chain to the entry that reached it
                while True:
                    v = reached[i]
                    if v == g:
                        out[v], owner[i] = i, v
                        return True
                    before = out[v]  # v was placed: it had an entry, which the node before it takes
                    out[v], owner[i] = i, v
                    i = before
            w = owner[i]
            if w not in queued:
                queued.add(w)
                queue.append(w)
    return False


def unsure_nodes(plan: Plan, nodes: Sequence[Sequence[object]], seen: Mapping[int, Sequence[object]],
                 chip_map: Mapping[str, str] | None = None,
                 device_names: Mapping[str, str] | None = None) -> dict[int, list[str]]:
    """{GROUP_RANK: the chip types it could be} for the nodes whose host did not say its chip type and whose
    process count (and vendor and device name, where entries run on it or name it, as match_nodes narrows) fits
    entries of more than one type: which they run rests on GROUP_RANK order alone (a c10d rendezvous: joining
    order), so the worker warns that HETEROPP_CHIP (or the types' device_name) should be set."""
    per_node = ranks_by_node(plan, nodes)
    seen, entries = _as_seen(seen), _Entries.of(nodes, chip_map, device_names)
    out = {}
    for g, node in sorted(seen.items()):
        types = {str(n[0]) for i, (n, r) in enumerate(zip(nodes, per_node))
                 if len(r) == node.procs and entries.allow(node, i)}
        if node.chip is None and len(types) > 1:
            out[g] = sorted(types)
    return out


def _layout(nodes: Sequence[Sequence[object]], per_node: list[list[int]]) -> str:
    return ", ".join(f"node {i}: {nodes[i][0]} with {len(r)} process{'es' if len(r) != 1 else ''} "
                     f"(plan ranks {r})" for i, r in enumerate(per_node))


def env_int(env: Mapping[str, str], name: str) -> int:
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
