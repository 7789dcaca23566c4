"""Reading sysfs (or a fake tree shaped like it): the root, attribute files and PCI locations."""
from __future__ import annotations

import os
import re

from dicomm.topology.model import PciLocation

DEFAULT_ROOT = "/sys"
ROOT_ENV = "DICOMM_SYSFS_ROOT"

_BDF = re.compile(r"^[0-9a-f]{4,}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_HOST_BRIDGE = re.compile(r"^pci[0-9a-f]{4,}:[0-9a-f]{2}$")


def resolve_root(sysfs_root: str | None = None) -> str:
    """The argument, else $DICOMM_SYSFS_ROOT, else /sys."""
    return sysfs_root or os.environ.get(ROOT_ENV) or DEFAULT_ROOT


def read(path: str) -> str | None:
    """A sysfs attribute, stripped; None when it is missing or unreadable."""
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return None


def read_int(path: str, base: int = 10) -> int | None:
    text = read(path)
    try:
        return int(text, base) if text is not None else None
    except ValueError:
        return None


def listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def pci_location(path: str, numa_node: int = -1) -> PciLocation | None:
    """The PCI function a resolved sysfs path lies in, or None when no PCI function is on it.

    The kernel nests each device under its parent, so the components of
    devices/pciDDDD:BB/<root port>/<switch ports...>/<device>[/virtioN/net/eth0] are the PCIe tree
    itself; the last PCI address on the path is the function, the ones before it its bridges.
    """
    parts = os.path.realpath(path).split(os.sep)
    hosts = [i for i, p in enumerate(parts) if _HOST_BRIDGE.match(p)]
    if not hosts:
        return None
    host = hosts[-1]
    bdfs = [p for p in parts[host + 1:] if _BDF.match(p)]
    if not bdfs:
        return None
    return PciLocation(address=bdfs[-1], host_bridge=parts[host], bridges=tuple(bdfs[:-1]),
                       numa_node=numa_node)


def pci_dir(path: str) -> str | None:
    """The sysfs directory of the PCI function a path lies in (itself, or its nearest ancestor)."""
    real = os.path.realpath(path)
    while real and real != os.sep:
        if _BDF.match(os.path.basename(real)):
            return real
        real = os.path.dirname(real)
    return None


def numa_node_of(device_dir: str) -> int:
    """numa_node of a PCI function; -1 (the kernel's 'unknown') when missing."""
    node = read_int(os.path.join(device_dir, "numa_node"))
    return -1 if node is None else node
