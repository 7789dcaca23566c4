"""Plain CPUs: always available, chosen last; collectives on gloo."""
from __future__ import annotations

from ditorch.adapter import CPU_PRIORITY, Adapter


def _detect() -> str | None:
    return None


def _runtime(device_type: str):  # the CPU has no accelerator runtime to map onto
    from ditorch.cpu_runtime import CpuRuntime

    return CpuRuntime()


ADAPTER = Adapter(
    name="cpu",
    device_type="cpu",
    backend="gloo",
    detect=_detect,
    priority=CPU_PRIORITY,
    aliases=("host",),
    description="CPU",
    runtime_factory=_runtime,
)
