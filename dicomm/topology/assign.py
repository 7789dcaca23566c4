"""Assignment: each local rank's accelerator gets its closest NIC; ties spread evenly.

Ranks whose closest class has one NIC take it first; then, in rank order, each rank with a tie
takes the least-loaded of its tied NICs (PCI bus order breaks equal loads). Every process runs the
same deterministic computation, so ranks agree without talking to each other.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from dicomm.topology.choice import NicChoice
from dicomm.topology.model import Accelerator, Nic, Topology
from dicomm.topology.nicmap import NIC_MAP_ENV, parse_nic_map, validate_nic_map
from dicomm.topology.paths import PathClass, classify
from dicomm.topology.visible import RankMap, rank_map


@dataclass
class Assignment:
    topology: Topology
    ranks: RankMap
    # slots[i] is the accelerator balanced as local rank i (all accelerators when each process
    # sees only one, since the other processes' devices are then unknown)
    slots: list[Accelerator]
    choices: list[NicChoice] = field(default_factory=list)
    nic_map: dict[int, str] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)   # NICs left out, with why
    picked: dict[int, str] = field(default_factory=dict)  # slot -> NIC name
    usable: list[Nic] = field(default_factory=list)      # NICs ranked for automatic choice

    def path(self, acc: Accelerator, nic: Nic) -> tuple[PathClass, str]:
        return classify(acc.pci, nic.pci)

    def for_rank(self, local_rank: int) -> NicChoice:
        """The choice for one local rank, including ranks without an accelerator."""
        if local_rank < 0:
            raise ValueError(f"local rank must be >= 0, got {local_rank}")
        if self.ranks.one_per_process and self.choices:
            acc = self.ranks.of(local_rank)
            if local_rank in self.nic_map:
                nic = self.topology.nic(self.nic_map[local_rank])
                return _explain(self, local_rank, acc, nic, self.usable)  # type: ignore[arg-type]
            slot = next(c for c, a in zip(self.choices, self.slots) if a is acc)
            return _relabel(slot, local_rank)
        if local_rank < len(self.choices):
            return self.choices[local_rank]
        return _no_accelerator(self, local_rank)


def assign(topo: Topology, env: Mapping[str, str] | None = None) -> Assignment:
    env = os.environ if env is None else env
    ranks = rank_map(topo.accelerators, env)
    slots = list(topo.accelerators if ranks.one_per_process else ranks.accelerators)
    result = Assignment(topo, ranks, slots)
    result.nic_map = parse_nic_map(env.get(NIC_MAP_ENV, ""))
    validate_nic_map(result.nic_map, [n.name for n in topo.nics],
                     len(slots) if slots else None, topo.sysfs_root)
    usable = [n for n in topo.nics if n.usable]
    result.skipped = [f"skipped {n.name} (no port ACTIVE)"
                      for n in topo.nics if not n.usable]
    if not usable and topo.nics:  # every NIC is down: rank them all rather than none
        usable = list(topo.nics)
        result.skipped = ["every NIC reports no ACTIVE port, so all are ranked"]
    result.usable = usable
    if not topo.nics:
        result.choices = [_no_nic(topo, r, a) for r, a in enumerate(slots)]
        return result
    picked = _balance(result, usable)
    result.picked = {r: n.name for r, n in picked.items()}
    result.choices = [_explain(result, r, acc, picked[r], usable) for r, acc in enumerate(slots)]
    return result


def _balance(result: Assignment, usable: list[Nic]) -> dict[int, Nic]:
    load = {n.name: 0 for n in result.topology.nics}
    picked: dict[int, Nic] = {}
    for r, name in result.nic_map.items():
        picked[r] = result.topology.nic(name)  # type: ignore[assignment]
        load[name] += 1
    best = {r: _best(result, acc, usable) for r, acc in enumerate(result.slots) if r not in picked}
    order = sorted(best, key=lambda r: (len(best[r]) > 1, r))
    for r in order:
        nic = min(best[r], key=lambda n: (load[n.name], usable.index(n)))
        picked[r] = nic
        load[nic.name] += 1
    return picked


def _best(result: Assignment, acc: Accelerator, usable: list[Nic]) -> list[Nic]:
    classes = {n.name: result.path(acc, n)[0] for n in usable}
    top = min(classes.values())
    return [n for n in usable if classes[n.name] == top]


def _explain(result: Assignment, rank: int, acc: Accelerator, nic: Nic,
             usable: list[Nic]) -> NicChoice:
    cls, why = result.path(acc, nic)
    best = _best(result, acc, usable)
    best_cls = result.path(acc, best[0])[0]
    parts = [why]
    if rank in result.nic_map:
        parts.insert(0, f"set by {NIC_MAP_ENV}")
        if best_cls < cls:
            parts.append(f"closest would be {', '.join(n.name for n in best)} ({best_cls.name})")
    elif len(best) > 1:
        others = [n.name for n in best if n is not nic]
        served = sorted(r for r, name in result.picked.items() if name == nic.name)
        parts.append(f"tied at {cls.name} with {', '.join(others)}; ties spread evenly "
                     f"({nic.name} serves local ranks {', '.join(map(str, served))})")
    if not cls.affinity and rank not in result.nic_map:
        parts.append("no usable NIC shares a PCIe switch with this accelerator")
    parts.extend(result.skipped)
    return NicChoice(local_rank=rank, nic=nic.name, netdev=nic.netdevs[0] if nic.netdevs else None,
                     path=cls.name, affinity=cls.affinity, reason="; ".join(parts),
                     accelerator=acc.pci.address, overridden=rank in result.nic_map)


def _relabel(choice: NicChoice, local_rank: int) -> NicChoice:
    return NicChoice(local_rank, choice.nic, choice.netdev, choice.path, choice.affinity,
                     choice.reason, choice.accelerator, choice.overridden)


def _no_nic(topo: Topology, rank: int, acc: Accelerator | None) -> NicChoice:
    return NicChoice(rank, None, None, None, False,
                     f"no RDMA NIC under {topo.sysfs_root}/class/infiniband",
                     acc.pci.address if acc else None)


def _no_accelerator(result: Assignment, rank: int) -> NicChoice:
    topo = result.topology
    if not topo.nics:
        return _no_nic(topo, rank, None)
    name = result.nic_map.get(rank)
    nic = topo.nic(name) if name else result.usable[rank % len(result.usable)]
    how = (f"set by {NIC_MAP_ENV}" if name else "NIC chosen round-robin by local rank")
    reason = (f"local rank {rank} has no accelerator ({len(result.slots)} found); {how}; "
              f"path unknown")
    return NicChoice(rank, nic.name, nic.netdevs[0] if nic.netdevs else None,  # type: ignore
                     None, False, reason, None, name is not None)
