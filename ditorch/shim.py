"""Turning the shim on and off: the chosen adapter and how torch calls are intercepted.

Two strategies serve the unified device name:
- ``patch`` (default): the torch entry points that take a device are wrapped, process-wide;
  no other torch call is touched.
- ``mode``: a torch-function mode on the calling thread's stack sees every torch call, also ones
  bound before ``import ditorch``; it costs a Python call per torch operation.
"""
from __future__ import annotations

import logging
import os
import threading

import torch

from ditorch.adapter import Adapter
from ditorch.device_apis import install_api_patches
from ditorch.hf_device_map import forget_hf_patches
from ditorch.mode import DeviceMode
from ditorch.patching import install_device_patches
from ditorch.patchset import PatchSet
from ditorch.registry import VENDOR_ENV, select
from ditorch.runtime import Runtime
from ditorch.translate import DeviceTranslator

logger = logging.getLogger("ditorch")

STRATEGY_ENV = "DITORCH_STRATEGY"
STRATEGIES = ("patch", "mode")


class _State:
    adapter: Adapter | None = None
    runtime: Runtime | None = None
    translator = DeviceTranslator("cpu", True)
    mode: DeviceMode | None = None
    device_patches = PatchSet()
    api_patches = PatchSet()  # non-factory device APIs, patched under both strategies


_state = _State()
_state.mode = DeviceMode(_state.translator)
_lock = threading.RLock()


def _stack() -> list:
    return [torch._C._get_function_stack_at(i) for i in range(torch._C._len_torch_function_stack())]


def _remove_from_stack(mode: DeviceMode) -> bool:
    """Take ``mode`` off this thread's torch-function stack, keeping any modes above it in order."""
    above = []
    found = False
    while torch._C._len_torch_function_stack():
        top = torch._C._pop_torch_function_stack()
        if top is mode:
            found = True
            break
        above.append(top)
    for other in reversed(above):
        torch._C._push_on_torch_function_stack(other)
    return found


def use_vendor(vendor: str | None = None) -> Adapter:
    """Choose the vendor (``vendor``, else ``$DITORCH_VENDOR``, else the first available) and log why."""
    adapter, reason = select(vendor if vendor is not None else os.environ.get(VENDOR_ENV) or None)
    return use_adapter(adapter, reason)


def use_adapter(adapter: Adapter, reason: str = "set by use_adapter()") -> Adapter:
    """Use ``adapter`` (e.g. one built in code rather than registered) and log why."""
    with _lock:
        _state.adapter = adapter
        _state.runtime = adapter.runtime()
        tr = _state.translator
        tr.configure(adapter.device_type, adapter.device_type == "cpu", tr.cuda_compat)
        tr.device_count = _state.runtime.count
    logger.info(
        "vendor %s (device type %s, backend %s) chosen: %s",
        adapter.name, adapter.device_type, adapter.backend, reason,
    )
    return adapter


def current_adapter() -> Adapter:
    """The adapter this process uses (chosen on first need)."""
    return _state.adapter if _state.adapter is not None else use_vendor()


def runtime() -> Runtime:
    current_adapter()
    assert _state.runtime is not None
    return _state.runtime


def translator() -> DeviceTranslator:
    current_adapter()
    return _state.translator


def _mode_on_this_thread() -> bool:
    return any(m is _state.mode for m in _stack())


def active_strategy() -> str | None:
    """``"patch"`` or ``"mode"`` when the unified device name works on this thread, else ``None``."""
    if _state.device_patches:
        return "patch"
    return "mode" if _mode_on_this_thread() else None


def is_enabled() -> bool:
    """Whether the unified device name works on this thread."""
    return active_strategy() is not None


def enable(vendor: str | None = None, strategy: str | None = None) -> Adapter:
    """Make ``"device"`` usable (``DITORCH_STRATEGY`` or ``"patch"``: process-wide; ``"mode"``:
    this thread). ``vendor`` switches to another vendor; without it the chosen one stays."""
    wanted = strategy or os.environ.get(STRATEGY_ENV) or "patch"
    if wanted not in STRATEGIES:
        raise ValueError(f"unknown ditorch strategy {wanted!r}; expected one of {', '.join(STRATEGIES)}")
    adapter = use_vendor(vendor) if vendor is not None else current_adapter()
    with _lock:
        if active_strategy() not in (None, wanted):
            _disable_device_name()
        if wanted == "patch" and not _state.device_patches:
            install_device_patches(_state.device_patches, _state.translator)
        elif wanted == "mode" and not _mode_on_this_thread():
            torch._C._push_on_torch_function_stack(_state.mode)
        if not _state.api_patches:
            install_api_patches(_state.api_patches, _state.translator, lambda: current_adapter().autocast_device_type)
    return adapter


def _disable_device_name() -> None:
    forget_hf_patches()
    _state.api_patches.undo()
    _state.device_patches.undo()
    while _remove_from_stack(_state.mode):  # pushed twice by hand would leave one behind
        pass


def disable_device_name() -> None:
    """Undo the device-name patches and remove the mode from this thread's stack (the CUDA
    compatibility layer, built on top of this one, is undone by ``ditorch.disable``)."""
    with _lock:
        _disable_device_name()


def state_lock() -> threading.RLock:
    """The lock that serialises switching the shim and the layers built on it."""
    return _lock


def device_obj(index: int | None = None) -> torch.device:
    """The real ``torch.device`` behind ``"device"`` (``torch.device("device")`` cannot exist)."""
    adapter = current_adapter()
    if index is None or adapter.device_type == "cpu":
        return torch.device(adapter.device_type)
    return torch.device(adapter.device_type, index)
