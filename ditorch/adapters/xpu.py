"""Intel GPUs: torch has native XPU support; collectives on XCCL (oneCCL)."""
from __future__ import annotations

import importlib.util

from ditorch.adapter import Adapter, device_module_reason, import_vendor_package


def _detect() -> str | None:
    # Older stacks need the extension to register the device; newer torch does it natively.
    if importlib.util.find_spec("intel_extension_for_pytorch") is not None:
        reason = import_vendor_package("intel_extension_for_pytorch")
        if reason is not None:
            return reason
    return device_module_reason("xpu")


ADAPTER = Adapter(
    name="xpu",
    device_type="xpu",
    backend="xccl",
    detect=_detect,
    priority=60,
    aliases=("intel",),
    description="Intel GPU (XPU)",
)
