"""What topology discovery finds: PCI locations, accelerators, RDMA NICs and NUMA nodes."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class PciLocation:
    """Where a PCI function sits in the PCIe tree.

    host_bridge is the root complex's sysfs name (``pci0000:16``); bridges are the PCI bridges from
    the root port down to the device's parent, root port first (empty for a device attached to the
    host bridge directly, as in most virtual machines).
    """
    address: str
    host_bridge: str
    bridges: tuple[str, ...] = ()
    numa_node: int = -1

    @property
    def root_port(self) -> str | None:
        return self.bridges[0] if self.bridges else None

    @property
    def switch_ports(self) -> tuple[str, ...]:
        """Bridges below the root port: the upstream and downstream ports of PCIe switches."""
        return self.bridges[1:]


@dataclass(frozen=True)
class Accelerator:
    """An accelerator found by PCI class and vendor id; index is its place in PCI bus order."""
    index: int
    pci: PciLocation
    vendor: str
    vendor_id: int
    device_id: int
    pci_class: int


@dataclass(frozen=True)
class NicPort:
    number: int
    state: str | None = None        # e.g. "ACTIVE", "DOWN"; None when the file is missing
    rate: str | None = None         # e.g. "200 Gb/sec (4X HDR)"
    link_layer: str | None = None   # "Ethernet" (RoCE) or "InfiniBand"


@dataclass(frozen=True)
class Nic:
    """An RDMA device from class/infiniband; pci is None when it has no PCI location at all."""
    name: str
    pci: PciLocation | None
    netdevs: tuple[str, ...] = ()
    ports: tuple[NicPort, ...] = ()
    virtual: bool = False           # a software device (Soft-RoCE) located by its parent netdev

    @property
    def usable(self) -> bool:
        """False only when every port reports a state and none is ACTIVE."""
        states = [p.state for p in self.ports]
        if not states or any(s is None for s in states):
            return True
        return any(s == "ACTIVE" for s in states)


@dataclass(frozen=True)
class NumaNode:
    node: int
    cpus: str = ""


@dataclass
class Topology:
    """Everything discovered under one sysfs root, in PCI bus order."""
    sysfs_root: str
    accelerators: list[Accelerator] = field(default_factory=list)
    nics: list[Nic] = field(default_factory=list)
    numa_nodes: list[NumaNode] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what could not be read, and why

    def nic(self, name: str) -> Nic | None:
        return next((n for n in self.nics if n.name == name), None)
