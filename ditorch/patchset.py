"""Attribute patches that can be undone exactly (the original objects come back, not copies)."""
from __future__ import annotations

import sys
from typing import Any

_ABSENT = object()


# Caches that enumerate torch's functions or Tensor methods by name on first use. Built while
# patched (or before), they would misjudge the functions after the change, e.g. torch.compile would
# stop routing torch calls through torch-function modes.
_ENUMERATING_CACHES = (
    ("torch.overrides", "get_ignored_functions"),
    ("torch.overrides", "get_default_nowrap_functions"),
    ("torch.overrides", "get_testing_overrides"),
    ("torch.overrides", "_get_overridable_functions"),
    ("torch.overrides", "_get_tensor_methods"),
    ("torch._dynamo.variables.torch", "get_overridable_functions"),
    ("torch._dynamo.trace_rules", "get_torch_obj_rule_map"),
    ("torch._dynamo.trace_rules", "get_tensor_method"),
)


def remember_device_constructors() -> None:
    """torch's default-device mode (``torch.set_default_device``, ``with torch.device("meta")``) knows the
    factories by identity and sees the originals our wrappers call: its set must be built from the
    originals, before any patch (rebuilt from wrappers, meta-device model construction in HuggingFace
    silently allocated on the CPU and left buffers uninitialised)."""
    import torch.utils._device

    torch.utils._device._device_constructors()


def _forget_enumerations() -> None:
    for module_name, func_name in _ENUMERATING_CACHES:
        module = sys.modules.get(module_name)  # never import a module just to clear it
        clear = getattr(getattr(module, func_name, None), "cache_clear", None)
        if clear is not None:
            clear()
    # torch.compile snapshots the Tensor attribute dicts when it is first imported.
    tensor_vars = sys.modules.get("torch._dynamo.variables.tensor")
    snapshot = getattr(tensor_vars, "all_tensor_attrs", None)
    if isinstance(snapshot, dict):
        import torch

        snapshot.clear()
        snapshot.update(torch._C.TensorBase.__dict__ | torch.Tensor.__dict__)


class PatchSet:
    def __init__(self) -> None:
        self._undo: list[tuple[Any, str, Any]] = []

    def __bool__(self) -> bool:
        return bool(self._undo)

    def set(self, owner: Any, name: str, value: Any) -> None:
        # vars(), not getattr(): an inherited attribute must be deleted again, not copied down.
        self._undo.append((owner, name, vars(owner).get(name, _ABSENT)))
        setattr(owner, name, value)
        _forget_enumerations()

    def undo(self) -> None:
        changed = bool(self._undo)
        while self._undo:
            owner, name, original = self._undo.pop()
            if original is _ABSENT:
                delattr(owner, name)
            else:
                setattr(owner, name, original)
        if changed:
            _forget_enumerations()
