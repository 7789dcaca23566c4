"""ditorch: one device name and one runtime API on every accelerator vendor.

``import ditorch`` chooses the vendor (``DITORCH_VENDOR`` or the first available, CPU last) and
makes ``device="device"`` work; ``DITORCH_CUDA_COMPAT=1`` also routes
CUDA spellings (booleans: 1/true/yes/on, 0/false/no/off). ``DITORCH_STRATEGY=mode`` intercepts with a torch-function
mode (per thread) instead of patching the device-taking entry points; ``DITORCH_ENABLE=0`` (or false/no/off)
imports without turning anything on.
"""
from __future__ import annotations

from ditorch.adapter import Adapter
from ditorch.cuda_compat import COMPAT_ENV, cuda_compat_enabled, disable_cuda_compat, enable_cuda_compat
from ditorch.env import env_flag
from ditorch.namespace import DeviceNamespace, device
from ditorch.registry import ENTRY_POINT_GROUP, VENDOR_ENV, VendorError, adapter_for, all_adapters
from ditorch.shim import (
    STRATEGY_ENV, current_adapter, device_obj, enable, is_enabled, active_strategy, use_adapter, use_vendor,
)
from ditorch.switch import disable

ENABLE_ENV = "DITORCH_ENABLE"

__all__ = [
    "Adapter", "DeviceNamespace", "VendorError", "adapter_for", "all_adapters", "current_adapter",
    "cuda_compat_enabled", "device", "device_obj", "disable", "disable_cuda_compat", "enable",
    "enable_cuda_compat", "is_enabled", "use_adapter", "use_vendor", "ENTRY_POINT_GROUP", "VENDOR_ENV", "COMPAT_ENV",
    "ENABLE_ENV", "STRATEGY_ENV", "active_strategy",
]


def _enable_from_environment() -> None:
    if not env_flag(ENABLE_ENV, True):
        return
    compat = env_flag(COMPAT_ENV, False)  # a bad value fails before anything is switched on
    enable()
    if compat:
        enable_cuda_compat()


_enable_from_environment()
