"""Which PCI functions are accelerators: a class rule and a vendor table.

A function counts when its vendor is in VENDORS and its class is an accelerator class. The vendor
table keeps out the BMC's VGA chip (ASPEED and the like) that every server has; Intel, which also
makes integrated graphics, counts only with the 3D, other-display and processing-accelerator
classes, never plain VGA (0x0300).
"""
from __future__ import annotations

VENDORS: dict[int, str] = {
    0x10DE: "NVIDIA",
    0x1002: "AMD",
    0x19E5: "Huawei",
    0xCABC: "Cambricon",
    0x1ED5: "Moore Threads",
    0x8086: "Intel",
    0x1DA3: "Habana",       # Gaudi, processing-accelerator class
    0x1D94: "Hygon",        # DCU
    0x1E36: "Enflame",
    0x1E3E: "Iluvatar",
    0x9999: "MetaX",
    0x1D22: "Kunlunxin",
}

_DISPLAY_BASE = 0x03      # 0x0300 VGA, 0x0302 3D controller, 0x0380 other display
_VGA = 0x0300
_PROCESSING_ACCEL = 0x1200


def is_accelerator(vendor_id: int, pci_class: int) -> bool:
    """pci_class is the 24-bit value of the sysfs `class` file (class, subclass, prog-if)."""
    name = VENDORS.get(vendor_id)
    if name is None:
        return False
    base, sub = pci_class >> 16, (pci_class >> 8) & 0xFFFF
    if sub == _PROCESSING_ACCEL:
        return True
    if base != _DISPLAY_BASE:
        return False
    return not (name == "Intel" and sub == _VGA)
