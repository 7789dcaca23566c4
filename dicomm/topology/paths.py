"""Path classes between an accelerator and a NIC, from closest to farthest, as NCCL names them.

PIX  same PCIe switch (each side has at most one bridge below the point where the paths meet)
PXB  several PCIe switches, without crossing the host bridge
PHB  same host bridge (root complex), different root ports: traffic crosses the CPU's PCIe root
NODE different host bridges in the same NUMA node
SYS  different NUMA nodes (crosses the inter-socket link), or a location that is not known
PIX and PXB are affinity paths: the NIC reaches the accelerator's memory without crossing the CPU,
which is what device-direct RDMA needs for full bandwidth.
"""
from __future__ import annotations

import enum

from dicomm.topology.model import PciLocation


class PathClass(enum.IntEnum):
    PIX = 0
    PXB = 1
    PHB = 2
    NODE = 3
    SYS = 4

    @property
    def affinity(self) -> bool:
        return self <= PathClass.PXB


def classify(a: PciLocation | None, b: PciLocation | None) -> tuple[PathClass, str]:
    """(class, why) for the path between two PCI functions."""
    if a is None or b is None:
        return PathClass.SYS, "no PCI location known"
    if a.host_bridge != b.host_bridge:
        if a.numa_node == b.numa_node and a.numa_node >= 0:
            return PathClass.NODE, (f"host bridges {a.host_bridge} and {b.host_bridge}, "
                                    f"both on NUMA node {a.numa_node}")
        if a.numa_node < 0 or b.numa_node < 0:
            return PathClass.SYS, (f"host bridges {a.host_bridge} and {b.host_bridge}, "
                                   f"NUMA node unknown")
        return PathClass.SYS, f"different NUMA nodes ({a.numa_node} and {b.numa_node})"
    common = 0
    for x, y in zip(a.bridges, b.bridges):
        if x != y:
            break
        common += 1
    if common == 0:
        return PathClass.PHB, (f"different root ports ({a.root_port or 'none'}, "
                               f"{b.root_port or 'none'}) of host bridge {a.host_bridge}")
    meet = a.bridges[common - 1]
    if len(a.bridges) - common <= 1 and len(b.bridges) - common <= 1:
        return PathClass.PIX, f"same PCIe switch (paths meet at {meet})"
    return PathClass.PXB, f"several PCIe switches (paths meet at {meet})"
