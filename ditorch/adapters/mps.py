"""Apple GPUs through Metal; there is no MPS collective library, so collectives run on gloo."""
from __future__ import annotations

from ditorch.adapter import Adapter


def _detect() -> str | None:
    import torch

    if not torch.backends.mps.is_available():
        return "torch.backends.mps.is_available() is False"
    return None


ADAPTER = Adapter(
    name="mps",
    device_type="mps",
    backend="gloo",
    detect=_detect,
    priority=70,
    aliases=("apple", "metal"),
    description="Apple GPU (Metal Performance Shaders)",
)
