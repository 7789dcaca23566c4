"""NVIDIA GPUs through torch's own CUDA build; collectives on NCCL."""
from __future__ import annotations

from ditorch.adapter import Adapter, device_module_reason


def _detect() -> str | None:
    import torch

    if torch.version.cuda is None:
        return "this torch build has no CUDA support"
    if torch.version.hip is not None:
        return "this torch build targets ROCm (see the rocm adapter)"
    return device_module_reason("cuda")


ADAPTER = Adapter(
    name="cuda",
    device_type="cuda",
    backend="nccl",
    detect=_detect,
    priority=10,
    aliases=("nvidia", "gpu"),
    description="NVIDIA GPU (torch CUDA build)",
)
