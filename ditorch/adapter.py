"""The vendor adapter record: what ditorch needs to know about one kind of chip."""
from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from ditorch.runtime import Runtime

# Selection order: lower runs first. Built-in accelerators use 10..90, CPU is always last.
THIRD_PARTY_PRIORITY = 500
CPU_PRIORITY = 1000


@dataclass(frozen=True)
class Adapter:
    """One vendor: how to detect it and how torch names its device, collectives and autocast.

    ``detect`` returns ``None`` when the vendor's chips are usable in this process, otherwise a
    short reason why not (shown in selection logs and errors).
    """

    name: str
    device_type: str
    backend: str
    detect: Callable[[], str | None]
    autocast_device_type: str = ""
    priority: int = THIRD_PARTY_PRIORITY
    aliases: tuple[str, ...] = ()
    package: str | None = None
    description: str = ""
    runtime_factory: Callable[[str], "Runtime"] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not self.autocast_device_type:
            object.__setattr__(self, "autocast_device_type", self.device_type)

    def unavailable_reason(self) -> str | None:
        """``None`` if usable here, else why not; a detector that raises counts as unavailable."""
        try:
            return self.detect()
        except Exception as exc:  # a broken vendor install must not break selection
            return f"detection failed: {type(exc).__name__}: {exc}"

    def is_available(self) -> bool:
        return self.unavailable_reason() is None

    def runtime(self) -> "Runtime":
        """The runtime calls (streams, events, memory, seeding) for this vendor's device type."""
        from ditorch.runtime import AcceleratorRuntime

        factory = self.runtime_factory or AcceleratorRuntime
        return factory(self.device_type)

    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)


def import_vendor_package(package: str) -> str | None:
    """Import a vendor's torch plug-in (it registers the device with torch); reason on failure."""
    if importlib.util.find_spec(package) is None:
        return f"{package} is not installed"
    try:
        importlib.import_module(package)
    except Exception as exc:
        return f"import {package} failed: {type(exc).__name__}: {exc}"
    return None


def device_module_reason(device_type: str) -> str | None:
    """Reason the torch device module for ``device_type`` has no usable device, or ``None``."""
    import torch

    module = getattr(torch, device_type, None)
    if module is None or not hasattr(module, "is_available"):
        return f"torch has no torch.{device_type} module"
    if not module.is_available():
        return f"torch.{device_type}.is_available() is False"
    if module.device_count() < 1:
        return f"torch.{device_type}.device_count() is 0"
    return None
