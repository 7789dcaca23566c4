"""dicomm-topo's output: devices, the accelerator x NIC path matrix and the assignment, as text
or as one JSON-ready dict with the same content."""
from __future__ import annotations

from dicomm.topology.assign import Assignment
from dicomm.topology.choice import NicChoice
from dicomm.topology.model import PciLocation

LEGEND = ("PIX same PCIe switch, PXB several switches, PHB same host bridge, NODE same NUMA node, "
          "SYS across NUMA; PIX/PXB are affinity paths")


def choices(result: Assignment, local_rank: int | None) -> list[NicChoice]:
    if local_rank is not None:
        return [result.for_rank(local_rank)]
    return list(result.choices)


def to_dict(result: Assignment, local_rank: int | None = None) -> dict[str, object]:
    topo = result.topology
    return {
        "sysfs_root": topo.sysfs_root,
        "numa_nodes": [{"node": n.node, "cpus": n.cpus} for n in topo.numa_nodes],
        "accelerators": [{"index": a.index, "vendor": a.vendor, "vendor_id": f"0x{a.vendor_id:04x}",
                          "device_id": f"0x{a.device_id:04x}", "class": f"0x{a.pci_class:06x}",
                          **_loc(a.pci)} for a in topo.accelerators],
        "nics": [{"name": n.name, "netdevs": list(n.netdevs), "virtual": n.virtual,
                  "usable": n.usable,
                  "ports": [{"port": p.number, "state": p.state, "rate": p.rate,
                             "link_layer": p.link_layer} for p in n.ports],
                  **(_loc(n.pci) if n.pci else {"pci": None})} for n in topo.nics],
        "matrix": {"nics": [n.name for n in topo.nics],
                   "rows": [{"accelerator": a.index,
                             "paths": [result.path(a, n)[0].name for n in topo.nics]}
                            for a in topo.accelerators]},
        "rank_order": result.ranks.how,
        "assignment": [c.to_dict() for c in choices(result, local_rank)],
        "notes": list(topo.notes),
    }


def _loc(pci: PciLocation) -> dict[str, object]:
    return {"pci": pci.address, "numa_node": pci.numa_node, "host_bridge": pci.host_bridge,
            "root_port": pci.root_port, "switch_ports": list(pci.switch_ports)}


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    fmt = "  " + "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*r).rstrip() for r in [header, *rows]]


def to_text(result: Assignment, local_rank: int | None = None) -> str:
    topo = result.topology
    out = [f"sysfs root: {topo.sysfs_root}",
           "NUMA nodes: " + (", ".join(f"{n.node} (cpus {n.cpus})" for n in topo.numa_nodes)
                             or "none listed"), ""]
    out.append(f"Accelerators ({len(topo.accelerators)}, PCI bus order)")
    if topo.accelerators:
        out += _table(["#", "pci", "vendor", "class", "numa", "host bridge", "root port",
                       "switch ports"],
                      [[str(a.index), a.pci.address, a.vendor, f"0x{a.pci_class:06x}",
                        str(a.pci.numa_node), a.pci.host_bridge, a.pci.root_port or "-",
                        " ".join(a.pci.switch_ports) or "-"] for a in topo.accelerators])
    out += ["", f"RDMA NICs ({len(topo.nics)})"]
    if topo.nics:
        out += _table(["name", "pci", "numa", "netdevs", "ports", "host bridge", "root port",
                       "switch ports"],
                      [[n.name, n.pci.address if n.pci else "-",
                        str(n.pci.numa_node) if n.pci else "-", ",".join(n.netdevs) or "-",
                        "; ".join(f"{p.number} {p.state or '?'} {p.rate or ''}".strip()
                                  for p in n.ports) or "-",
                        n.pci.host_bridge if n.pci else "-",
                        (n.pci.root_port or "-") if n.pci else "-",
                        " ".join(n.pci.switch_ports) if n.pci and n.pci.switch_ports else "-"]
                       for n in topo.nics])
    if topo.accelerators and topo.nics:
        out += ["", f"Path matrix ({LEGEND})"]
        out += _table(["", *(n.name for n in topo.nics)],
                      [[f"acc{a.index}", *(result.path(a, n)[0].name for n in topo.nics)]
                       for a in topo.accelerators])
    out += ["", f"Assignment ({result.ranks.how})"]
    rows = choices(result, local_rank)
    if rows:
        out += _table(["rank", "accelerator", "nic", "netdev", "path", "affinity", "reason"],
                      [[str(c.local_rank), c.accelerator or "-", c.nic or "-", c.netdev or "-",
                        c.path or "-", "yes" if c.affinity else "NO", c.reason] for c in rows])
    else:
        out.append("  no local ranks: no accelerator found (use --local-rank N for a CPU rank)")
    if topo.notes:
        out += ["", "Notes"] + [f"  - {n}" for n in topo.notes]
    return "\n".join(out) + "\n"
