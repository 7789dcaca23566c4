"""Huawei Ascend NPU through the vendor plug-in `torch_npu`; collectives on HCCL."""
from __future__ import annotations

from ditorch.adapter import Adapter, device_module_reason, import_vendor_package


def _detect() -> str | None:
    # Importing the plug-in registers torch.npu and the "npu" device type with torch.
    return import_vendor_package("torch_npu") or device_module_reason("npu")


ADAPTER = Adapter(
    name="npu",
    device_type="npu",
    backend="hccl",
    detect=_detect,
    priority=30,
    aliases=("ascend", "huawei"),
    package="torch_npu",
    description="Huawei Ascend NPU",
)
