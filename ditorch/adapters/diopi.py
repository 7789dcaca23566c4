"""Any operator library exporting the DIOPI ABI, as the ``diopi`` device (diopi_bindings).

For a chip whose vendor ships an operator library but no torch plug-in: ``DIOPI_LIBRARY=path/to/lib.so``
makes the device available (chosen after every native accelerator, before the CPU);
``DITORCH_VENDOR=diopi`` without ``DIOPI_LIBRARY`` uses the CPU reference library; so does a process that
called ``diopi_bindings.device.enable(...)`` itself.
"""
from __future__ import annotations

import os
import sys

from ditorch.adapter import Adapter
from ditorch.registry import VENDOR_ENV

LIBRARY_ENV = "DIOPI_LIBRARY"


def _detect() -> str | None:
    path = os.environ.get(LIBRARY_ENV)
    requested = os.environ.get(VENDOR_ENV, "").strip().lower() in ADAPTER.names()
    loaded = sys.modules.get("diopi_bindings.device")
    if loaded is not None and loaded.is_enabled():  # enabled in code: diopi_bindings.device.enable(lib)
        return None
    if not path and not requested:
        return f"{LIBRARY_ENV} is not set (nor diopi_bindings.device.enable() called)"
    try:
        from diopi_bindings import device
    except ImportError as exc:
        return f"diopi_bindings is not importable: {exc}"
    try:  # not enabled yet: checked above, and importing the module enables nothing
        device.enable(path or None)  # registers the "diopi" device type with torch
    except Exception as exc:  # a malformed library: say why, never raise from detection
        return f"{type(exc).__name__}: {exc}"
    return None


def _runtime(device_type: str):
    from ditorch.runtime import AcceleratorRuntime

    class DiopiRuntime(AcceleratorRuntime):
        """The host-memory device goes through ``torch.diopi`` only: torch.accelerator's device-wide
        calls (synchronize) need a C++ device guard, which only the native device has."""

        def _accel(self):
            from diopi_bindings import device

            return super()._accel() if device.backend() == "native" else None

    return DiopiRuntime(device_type)


ADAPTER = Adapter(
    name="diopi",
    device_type="diopi",
    backend="gloo",
    detect=_detect,
    priority=900,
    aliases=("dipu",),
    package="diopi_bindings",
    description="an operator library through the DIOPI ABI",
    runtime_factory=_runtime,
)
