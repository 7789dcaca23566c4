"""AMD GPUs: torch's ROCm build reuses the "cuda" device type, and RCCL answers to "nccl"."""
from __future__ import annotations

from ditorch.adapter import Adapter, device_module_reason


def _detect() -> str | None:
    import torch

    if getattr(torch.version, "hip", None) is None:
        return "this torch build has no ROCm support"
    return device_module_reason("cuda")


ADAPTER = Adapter(
    name="rocm",
    device_type="cuda",
    backend="nccl",
    detect=_detect,
    priority=20,
    aliases=("amd", "hip"),
    description="AMD GPU (torch ROCm build)",
)
