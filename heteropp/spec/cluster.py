"""Cluster spec: chip types (count, memory, peak TFLOPS, node shape, bandwidths) and cross-group links.

A type's nodes are either `count` chips in nodes of `chips_per_node` (the last one holding the rest) or
listed one by one, `nodes: [8, 4, 4]` (HexiScale's one 8-GPU and two 4-GPU machines): then the count is
their sum and the largest node bounds its tensor parallelism."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import SpecError
from .io import Fields, load_mapping


@dataclass(frozen=True)
class ChipType:
    """One homogeneous group of chips. Bandwidths in GB/s, memory in GB (1e9 bytes)."""

    name: str
    count: int
    memory_gb: float
    peak_tflops: float
    chips_per_node: int
    tp_max: int
    intra_node_bw: float
    network_bw: float
    efficiency: float = 0.5  # achievable fraction of peak for the analytic profile
    memory_fraction: float = 0.9  # the "safe capacity": fragmentation and runtime reserve
    hbm_bw: float = 1500.0  # for the memory-bound optimizer step in the analytic profile
    device: str = "cpu"  # ditorch device type the engine maps this chip to
    network_latency_s: float = 0.0  # one message between nodes, on top of its bytes / network_bw
    nodes: tuple[int, ...] = ()  # chips of each node where the spec lists them (`nodes:`); () = uniform nodes
    # A shell pattern (case-insensitive) of the name its hosts' accelerator reports ("*A100*": torch.cuda's
    # get_device_name; the CPU's model name on CPU hosts): a host that does not say its chip type is told apart
    # by it from the other types of its vendor (engine/device_match.py). None: not by name.
    device_name: str | None = None

    @property
    def node_sizes(self) -> tuple[int, ...]:
        """Chips of each node: as listed, else `count // chips_per_node` full nodes and one with the rest."""
        if self.nodes:
            return self.nodes
        full, rest = divmod(self.count, self.chips_per_node)
        return (self.chips_per_node,) * full + ((rest,) if rest else ())

    @property
    def usable_bytes(self) -> float:
        return self.memory_gb * 1e9 * self.memory_fraction


@dataclass(frozen=True)
class Cluster:
    name: str
    chips: tuple[ChipType, ...]
    links: dict[tuple[str, str], float] = field(default_factory=dict)  # aggregate GB/s between two groups
    link_latency: dict[tuple[str, str], float] = field(default_factory=dict)  # seconds per message on a link

    def chip(self, name: str) -> ChipType:
        for c in self.chips:
            if c.name == name:
                return c
        raise KeyError(f"chip type {name!r} not in cluster {self.name!r} (has {', '.join(c.name for c in self.chips)})")

    def link_bw(self, a: str, b: str) -> float | None:
        """Aggregate bandwidth of an explicit link between two chip groups, None when they share the fabric."""
        return self.links.get((a, b)) or self.links.get((b, a))

    def latency_s(self, a: str, b: str) -> float:
        """Latency of one message from a stage of type a to one of type b: the explicit link's, else the
        larger of the two types' network latencies."""
        for key in ((a, b), (b, a)):
            if key in self.link_latency:
                return self.link_latency[key]
        return max(self.chip(a).network_latency_s, self.chip(b).network_latency_s)

    @property
    def total_chips(self) -> int:
        return sum(c.count for c in self.chips)


_CHIP_KEYS = {"name", "count", "memory_gb", "peak_tflops", "chips_per_node", "nodes", "tp_max", "intra_node_bw",
              "network_bw", "efficiency", "memory_fraction", "hbm_bw", "device", "network_latency", "device_name"}
MAX_PATTERN = 200  # characters of a device_name pattern


# Plausible ranges of a chip's numbers: outside them the cost model produces 0-second or infinite times.
# chips of one type: 16.8 million, over a hundred times the largest clusters built; a count beyond it is a
# typo (1e12 planned 64 of them and exited 0), and plans of such counts leave nearly every chip idle
MAX_COUNT = 1 << 24
MEMORY_GB = (1e-6, 1e6)
TFLOPS = (1e-6, 1e6)
BANDWIDTH = (1e-9, 1e12)  # GB/s: about 1 byte/s up to "free" (tests model zero-cost links so)
FRACTION = (1e-3, 1.0)


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _node_shape(c: Fields, raw: dict[str, Any]) -> tuple[int, int, tuple[int, ...]]:
    """(count, chips_per_node, listed nodes) of one chip type: `nodes` or `count` + `chips_per_node`."""
    if "nodes" not in raw:
        return c.int("count", max=MAX_COUNT), c.int("chips_per_node", max=MAX_COUNT), ()
    if "chips_per_node" in raw:
        raise c.err("chips_per_node", "given together with nodes",
                    "one of the two: nodes lists every node's chips, chips_per_node makes them all alike")
    sizes = c.list("nodes")
    if not sizes:
        raise c.err("nodes", "empty list", "the chips of each node, e.g. [8, 4, 4]")
    for i, n in enumerate(sizes):
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_COUNT:
            raise c.err(f"nodes[{i}]", f"got {n!r}", f"an integer from 1 to {MAX_COUNT} (the chips of one node)")
    total = sum(sizes)
    if total > MAX_COUNT:
        raise c.err("nodes", f"{total} chips in all", f"at most {MAX_COUNT} chips of one type")
    if "count" in raw and c.int("count", max=MAX_COUNT) != total:
        raise c.err("count", f"got {raw['count']!r} but nodes {sizes} hold {total} chips",
                    "the nodes' sum, or leave count out")
    return total, max(sizes), tuple(sizes)


def _device_name(c: Fields, raw: dict[str, Any]) -> str | None:
    if "device_name" not in raw:
        return None
    pattern = c.str("device_name")
    if not pattern.strip() or len(pattern) > MAX_PATTERN or not pattern.isprintable():
        raise c.err("device_name", f"got {pattern[:MAX_PATTERN]!r}", f"a pattern of 1 to {MAX_PATTERN} printable "
                    "characters matching the name the hosts' accelerator reports, e.g. '*A100*'")
    return pattern


def cluster_from_dict(data: dict[str, Any], source: str = "<cluster>") -> Cluster:
    f = Fields(data, source)
    f.unknown({"name", "chips", "links"})
    chips: list[ChipType] = []
    for i, raw in enumerate(f.list("chips")):
        if not isinstance(raw, dict):
            raise SpecError(source, f"chips[{i}]", f"got {type(raw).__name__}", "a mapping")
        c = Fields(raw, source, f"chips[{i}].")
        c.unknown(_CHIP_KEYS)
        count, cpn, nodes = _node_shape(c, raw)
        # listed nodes: TP up to the largest power of two that fits the largest node
        tp_max = c.int("tp_max", 1 << (cpn.bit_length() - 1) if nodes else cpn, max=MAX_COUNT)
        if not _power_of_two(tp_max):
            raise c.err("tp_max", f"got {tp_max}", "a power of two")
        if tp_max > cpn:
            where = f"the largest node's {cpn} chips" if nodes else f"chips_per_node={cpn}"
            raise c.err("tp_max", f"{tp_max} exceeds {where}", "tensor parallelism inside one node")
        chips.append(
            ChipType(
                name=c.str("name"),
                count=count,
                memory_gb=c.float("memory_gb", lo=MEMORY_GB[0], hi=MEMORY_GB[1]),
                peak_tflops=c.float("peak_tflops", lo=TFLOPS[0], hi=TFLOPS[1]),
                chips_per_node=cpn,
                tp_max=tp_max,
                intra_node_bw=c.bandwidth("intra_node_bw", lo=BANDWIDTH[0], hi=BANDWIDTH[1]),
                network_bw=c.bandwidth("network_bw", lo=BANDWIDTH[0], hi=BANDWIDTH[1]),
                efficiency=c.float("efficiency", 0.5, lo=FRACTION[0], hi=FRACTION[1]),
                memory_fraction=c.float("memory_fraction", 0.9, lo=FRACTION[0], hi=FRACTION[1]),
                hbm_bw=c.bandwidth("hbm_bw", 1500.0, lo=BANDWIDTH[0], hi=BANDWIDTH[1]),
                device=c.str("device", "cpu"),
                network_latency_s=c.duration("network_latency"),
                nodes=nodes,
                device_name=_device_name(c, raw),
            )
        )
    if not chips:
        raise f.err("chips", "empty list", "at least one chip type")
    names = [c.name for c in chips]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise f.err("chips", f"duplicate chip name {sorted(dup)[0]!r}", "unique names")
    links: dict[tuple[str, str], float] = {}
    latency: dict[tuple[str, str], float] = {}
    for i, raw in enumerate(f.list("links", required=False)):
        if not isinstance(raw, dict):
            raise SpecError(source, f"links[{i}]", f"got {type(raw).__name__}", "a mapping with between and bandwidth")
        lf = Fields(raw, source, f"links[{i}].")
        lf.unknown({"between", "bandwidth", "latency"})
        pair = lf.list("between")
        if len(pair) != 2 or any(p not in names for p in pair):
            raise lf.err("between", f"got {pair!r}", f"two chip names out of {names}")
        if pair[0] == pair[1]:
            raise lf.err("between", f"links {pair[0]!r} to itself", "two different chip types (a type's own "
                         "fabric is its intra_node_bw and network_bw)")
        key = (pair[0], pair[1])
        if key in links or key[::-1] in links:
            raise lf.err("between", f"a second link between {pair[0]!r} and {pair[1]!r}",
                         "one link per pair of chip types (a link carries both directions)")
        links[key] = lf.bandwidth("bandwidth", lo=BANDWIDTH[0], hi=BANDWIDTH[1])
        if "latency" in raw:
            latency[key] = lf.duration("latency")
    return Cluster(name=f.str("name", Path(source).stem), chips=tuple(chips), links=links, link_latency=latency)


def load_cluster(path: str | Path) -> Cluster:
    return cluster_from_dict(load_mapping(path), str(path))
