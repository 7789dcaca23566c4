"""Moore Threads GPU through the vendor plug-in `torch_musa`; collectives on MCCL."""
from __future__ import annotations

from ditorch.adapter import Adapter, device_module_reason, import_vendor_package


def _detect() -> str | None:
    # Importing the plug-in registers torch.musa and the "musa" device type with torch.
    return import_vendor_package("torch_musa") or device_module_reason("musa")


ADAPTER = Adapter(
    name="musa",
    device_type="musa",
    backend="mccl",
    detect=_detect,
    priority=50,
    aliases=("mthreads", "moorethreads"),
    package="torch_musa",
    description="Moore Threads GPU",
)
