"""Discovery: accelerators, RDMA NICs with their netdevs and ports, and NUMA nodes, from sysfs."""
from __future__ import annotations

import os

from dicomm.topology import sysfs
from dicomm.topology.model import Accelerator, Nic, NicPort, NumaNode, PciLocation, Topology
from dicomm.topology.vendors import VENDORS, is_accelerator


def discover(sysfs_root: str | None = None) -> Topology:
    """Everything under one sysfs root; a host without accelerators or NICs gives empty lists."""
    root = sysfs.resolve_root(sysfs_root)
    topo = Topology(sysfs_root=root)
    if not os.path.isdir(root):
        topo.notes.append(f"sysfs root {root} is not a directory; nothing discovered")
        return topo
    topo.accelerators = _accelerators(root)
    topo.nics = _nics(root, topo.notes)
    topo.numa_nodes = _numa_nodes(root)
    if not topo.accelerators:
        topo.notes.append(f"no accelerator under {root}/bus/pci/devices (PCI classes 0x03xxxx or "
                          f"0x1200xx of a known vendor)")
    if not topo.nics:
        topo.notes.append(f"no RDMA NIC under {root}/class/infiniband")
    return topo


def _bus_order(address: str) -> tuple[int, ...]:
    domain, bus, devfn = address.split(":")
    dev, fn = devfn.split(".")
    return int(domain, 16), int(bus, 16), int(dev, 16), int(fn, 16)


def _accelerators(root: str) -> list[Accelerator]:
    base = os.path.join(root, "bus", "pci", "devices")
    found: list[tuple[PciLocation, int, int, int]] = []
    for name in sysfs.listdir(base):
        dev = os.path.join(base, name)
        vendor = sysfs.read_int(os.path.join(dev, "vendor"), 16)
        pci_class = sysfs.read_int(os.path.join(dev, "class"), 16)
        if vendor is None or pci_class is None or not is_accelerator(vendor, pci_class):
            continue
        loc = sysfs.pci_location(dev, sysfs.numa_node_of(dev))
        if loc is None:
            continue
        device_id = sysfs.read_int(os.path.join(dev, "device"), 16) or 0
        found.append((loc, vendor, device_id, pci_class))
    found.sort(key=lambda f: _bus_order(f[0].address))
    return [Accelerator(index=i, pci=loc, vendor=VENDORS[v], vendor_id=v, device_id=d, pci_class=c)
            for i, (loc, v, d, c) in enumerate(found)]


def _nics(root: str, notes: list[str]) -> list[Nic]:
    base = os.path.join(root, "class", "infiniband")
    nics = []
    for name in sysfs.listdir(base):
        ib = os.path.join(base, name)
        device = os.path.join(ib, "device")
        if os.path.exists(device):
            loc = sysfs.pci_location(device, sysfs.numa_node_of(device))
            netdevs = _netdevs_of_pci(root, device)
            nics.append(Nic(name, loc, netdevs, _ports(ib)))
            continue
        # Software RDMA (Soft-RoCE rxe, siw) has no device link; its parent netdev places it.
        parent = sysfs.read(os.path.join(ib, "parent"))
        loc = None
        if parent:
            net = os.path.join(root, "class", "net", parent)
            pdir = sysfs.pci_dir(net)
            loc = sysfs.pci_location(net, sysfs.numa_node_of(pdir)) if pdir else None
        if loc is None:
            notes.append(f"RDMA device {name} has no PCI location (no device link, parent netdev "
                         f"{parent or 'unknown'}); it is ranked as a cross-NUMA (SYS) path")
        nics.append(Nic(name, loc, (parent,) if parent else (), _ports(ib), virtual=True))
    # PCI bus order, like the accelerators: it breaks ties, so it must not depend on names.
    return sorted(nics, key=lambda n: (0, _bus_order(n.pci.address), n.name) if n.pci
                  else (1, (), n.name))


def _netdevs_of_pci(root: str, device: str) -> tuple[str, ...]:
    """Netdevs of an RDMA device's PCI function: device/net/*, else class/net/*/device links."""
    names = sysfs.listdir(os.path.join(device, "net"))
    if names:
        return tuple(names)
    target = os.path.realpath(device)
    net = os.path.join(root, "class", "net")
    return tuple(n for n in sysfs.listdir(net)
                 if os.path.realpath(os.path.join(net, n, "device")) == target)


def _ports(ib: str) -> tuple[NicPort, ...]:
    ports = []
    for p in sysfs.listdir(os.path.join(ib, "ports")):
        if not p.isdigit():
            continue
        pdir = os.path.join(ib, "ports", p)
        state = sysfs.read(os.path.join(pdir, "state"))  # "4: ACTIVE"
        ports.append(NicPort(int(p), state.split(":")[-1].strip() if state else None,
                             sysfs.read(os.path.join(pdir, "rate")),
                             sysfs.read(os.path.join(pdir, "link_layer"))))
    return tuple(sorted(ports, key=lambda x: x.number))


def _numa_nodes(root: str) -> list[NumaNode]:
    base = os.path.join(root, "devices", "system", "node")
    nodes = [n for n in sysfs.listdir(base) if n.startswith("node") and n[4:].isdigit()]
    return sorted((NumaNode(int(n[4:]), sysfs.read(os.path.join(base, n, "cpulist")) or "")
                   for n in nodes), key=lambda n: n.node)
