"""Cambricon MLU through the vendor plug-in `torch_mlu`; collectives on CNCL."""
from __future__ import annotations

from ditorch.adapter import Adapter, device_module_reason, import_vendor_package


def _detect() -> str | None:
    # Importing the plug-in registers torch.mlu and the "mlu" device type with torch.
    return import_vendor_package("torch_mlu") or device_module_reason("mlu")


ADAPTER = Adapter(
    name="mlu",
    device_type="mlu",
    backend="cncl",
    detect=_detect,
    priority=40,
    aliases=("cambricon",),
    package="torch_mlu",
    description="Cambricon MLU",
)
