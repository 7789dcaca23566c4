"""Helpers for the ditorch tests: saving and restoring the shim's state, running a fresh interpreter."""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

import ditorch
from ditorch import shim as _shim
from ditorch.mode import DeviceMode

REPO_ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parent / "fixtures"


# The hosts these tests run on: CPU-only machines (the CPU adapter) and CUDA machines.
EXPECTED_TYPE = "cuda" if torch.cuda.is_available() else "cpu"


def placed() -> torch.device:
    """Where a tensor made on "device" lands: ditorch's device with the index its vendor gives a new tensor
    (cuda:0 on a CUDA host, none on the CPU), where ``ditorch.device_obj()`` is the bare type, as
    ``torch.device("cuda")`` is."""
    with torch._C.DisableTorchFunction():
        return torch.empty(0, device=ditorch.device_obj()).device


def ditorch_modes_on_stack() -> list:
    stack = [torch._C._get_function_stack_at(i) for i in range(torch._C._len_torch_function_stack())]
    return [m for m in stack if isinstance(m, DeviceMode)]


@dataclass
class SavedState:
    adapter: ditorch.Adapter | None
    strategy: str | None
    compat: bool


def save_state() -> SavedState:
    return SavedState(_shim._state.adapter, ditorch.active_strategy(), ditorch.cuda_compat_enabled())


def restore_state(saved: SavedState) -> None:
    ditorch.disable()
    assert not ditorch_modes_on_stack(), "ditorch.disable() left its mode on the torch-function stack"
    assert not _shim._state.device_patches, "ditorch.disable() left patches behind"
    if saved.adapter is not None and saved.adapter is not _shim._state.adapter:
        ditorch.use_adapter(saved.adapter, "restored after a test")
    if saved.strategy is not None:
        ditorch.enable(strategy=saved.strategy)
    if saved.compat:
        ditorch.enable_cuda_compat()


def run_python(code: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter (no ditorch imported beforehand) from the repository root."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("DITORCH_")}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, env=full_env, capture_output=True, text=True, timeout=timeout
    )
