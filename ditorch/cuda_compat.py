"""Opt-in CUDA compatibility: unmodified CUDA scripts run on the chosen vendor.

Routes ``device="cuda"``, ``.cuda()``, availability, device count, current device, streams,
events, memory statistics, synchronize and seeding. It never fakes capability numbers, device
properties or names, nor ``tensor.device.type == "cuda"``: code that asks those gets the truth.
"""
from __future__ import annotations

import logging
from typing import Any, Callable

import torch

from ditorch import shim
from ditorch.patching import install_cuda_patches
from ditorch.patchset import PatchSet

logger = logging.getLogger("ditorch")

COMPAT_ENV = "DITORCH_CUDA_COMPAT"

# torch.cuda name -> how to serve it from the vendor runtime.
_ROUTES: dict[str, Callable[[], Any]] = {
    "is_available": lambda: lambda: shim.runtime().is_available(),
    "device_count": lambda: lambda: shim.runtime().count(),
    "current_device": lambda: lambda: shim.runtime().current(),
    "set_device": lambda: lambda device: shim.runtime().set(_index(device)),
    "synchronize": lambda: lambda device=None: shim.runtime().synchronize(_opt_index(device)),
    "current_stream": lambda: lambda device=None: shim.runtime().current_stream(_opt_index(device)),
    "stream": lambda: lambda stream: shim.runtime().stream(stream),
    "memory_allocated": lambda: lambda device=None: shim.runtime().memory_allocated(_opt_index(device)),
    "max_memory_allocated": lambda: lambda device=None: shim.runtime().max_memory_allocated(_opt_index(device)),
    "memory_reserved": lambda: lambda device=None: shim.runtime().memory_reserved(_opt_index(device)),
    "max_memory_reserved": lambda: lambda device=None: shim.runtime().max_memory_reserved(_opt_index(device)),
    "reset_peak_memory_stats": lambda: lambda device=None: shim.runtime().reset_peak_memory_stats(_opt_index(device)),
    "empty_cache": lambda: lambda: shim.runtime().empty_cache(),
    "manual_seed": lambda: lambda seed: shim.runtime().manual_seed(seed),
    "manual_seed_all": lambda: lambda seed: shim.runtime().manual_seed_all(seed),
    "get_rng_state": lambda: lambda device="cuda": shim.runtime().get_rng_state(_opt_index(device)),
    "set_rng_state": lambda: lambda state, device="cuda": shim.runtime().set_rng_state(state, _opt_index(device)),
    "get_rng_state_all": lambda: lambda: [shim.runtime().get_rng_state(i) for i in range(shim.runtime().count())],
    "set_rng_state_all": lambda: _set_rng_state_all,
    "is_bf16_supported": lambda: lambda including_emulation=True: shim.runtime().is_bf16_supported(),
    "Stream": lambda: shim.runtime().Stream,
    "Event": lambda: shim.runtime().Event,
}

_patches = PatchSet()


def _index(device: Any) -> int:
    if isinstance(device, torch.device):
        return 0 if device.index is None else device.index
    if isinstance(device, str):
        return int(device.split(":")[1]) if ":" in device else 0
    return int(device)


def _set_rng_state_all(states: list[torch.Tensor]) -> None:
    for index, state in enumerate(states):
        shim.runtime().set_rng_state(state, index)


def _opt_index(device: Any) -> int | None:
    # torch.cuda calls default to "cuda" (the current device) in some signatures, None in others.
    return None if device is None or device == "cuda" else _index(device)


def cuda_compat_enabled() -> bool:
    return bool(_patches) or (shim._state.translator.cuda_compat and shim.is_enabled())


def enable_cuda_compat() -> None:
    """Route CUDA spellings to the chosen vendor (also enables the shim)."""
    adapter = shim.enable()
    tr = shim.translator()
    tr.configure(adapter.device_type, adapter.device_type == "cpu", cuda_compat=True)
    if adapter.device_type == "cuda" or _patches:
        return  # CUDA itself (or already patched): torch.cuda is the truth already
    install_cuda_patches(_patches, tr)
    for name, route in _ROUTES.items():
        _patches.set(torch.cuda, name, route())
    logger.info("CUDA compatibility on: cuda -> %s", adapter.device_type)


def disable_cuda_compat() -> None:
    """Undo every CUDA patch, restoring the original objects (identity, not copies)."""
    _patches.undo()
    tr = shim._state.translator
    if tr.cuda_compat:
        tr.configure(tr.device_type, tr.single_device, cuda_compat=False)
