"""Topology discovery and NIC-affinity selection for dicomm.

Reads sysfs (``DICOMM_SYSFS_ROOT``, default ``/sys``) to find accelerators, RDMA NICs, NUMA nodes
and the PCIe tree between them, classifies every accelerator-NIC path as NCCL does (PIX, PXB, PHB,
NODE, SYS) and gives each local rank its closest NIC. Nothing here imports torch.
"""
from __future__ import annotations

import os
from collections.abc import Mapping

from dicomm.topology.assign import Assignment, assign
from dicomm.topology.choice import NicChoice
from dicomm.topology.discover import discover
from dicomm.topology.model import Accelerator, Nic, NicPort, NumaNode, PciLocation, Topology
from dicomm.topology.nicmap import NIC_MAP_ENV, TopologyError, parse_nic_map
from dicomm.topology.paths import PathClass, classify
from dicomm.topology.sysfs import DEFAULT_ROOT, ROOT_ENV


def select_nic(local_rank: int, sysfs_root: str | None = None,
               env: Mapping[str, str] | None = None) -> NicChoice:
    """The NIC local_rank should use, with its path class and the reason.

    Raises TopologyError when DICOMM_NIC_MAP is malformed or names a NIC or rank this node lacks;
    a node without accelerators or NICs is not an error (see NicChoice.nic and .path).
    """
    env = os.environ if env is None else env
    return assign(discover(sysfs_root), env).for_rank(local_rank)


__all__ = ["Accelerator", "Assignment", "DEFAULT_ROOT", "NIC_MAP_ENV", "Nic", "NicChoice",
           "NicPort", "NumaNode", "PathClass", "PciLocation", "ROOT_ENV", "Topology",
           "TopologyError", "assign", "classify", "discover", "parse_nic_map", "select_nic"]
