"""HuggingFace ``from_pretrained(device_map=...)`` with the unified device name.

transformers turns every ``device_map`` value into ``torch.device(value)``, which no patch can make
accept ``"device"``; the values are translated before ``PreTrainedModel.from_pretrained`` sees them.
transformers is patched when it is imported (never imported by ditorch itself): at ``enable()`` if it
is loaded already, else by a finder that patches ``transformers.modeling_utils`` right after it loads.
"""
from __future__ import annotations

import functools
import importlib.abc
import sys
from typing import Any, Callable

from ditorch.patchset import PatchSet

MODULE = "transformers.modeling_utils"


def _patch(module: Any, patches: PatchSet, translate: Callable[[Any], Any]) -> None:
    model_class = module.PreTrainedModel
    original = model_class.__dict__["from_pretrained"].__func__

    @functools.wraps(original)
    def from_pretrained(cls: type, *args: Any, **kwargs: Any) -> Any:
        device_map = kwargs.get("device_map")
        if isinstance(device_map, dict):
            kwargs["device_map"] = {k: translate(v) for k, v in device_map.items()}
        elif device_map is not None:
            kwargs["device_map"] = translate(device_map)
        return original(cls, *args, **kwargs)

    patches.set(model_class, "from_pretrained", classmethod(from_pretrained))


# Set while the shim is on and transformers is not loaded yet: where the patch goes, how to translate.
_pending: tuple[PatchSet, Callable[[Any], Any]] | None = None


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patches ``transformers.modeling_utils`` as soon as it has executed, if the shim is still on."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != MODULE or _pending is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                exec_module = spec.loader.exec_module

                def exec_and_patch(module: Any, exec_module: Callable = exec_module) -> None:
                    exec_module(module)
                    if _pending is not None:
                        _patch(module, *_pending)

                spec.loader.exec_module = exec_and_patch
                return spec
        return None


_FINDER = _PatchOnImport()


def install_hf_patches(patches: PatchSet, translate: Callable[[Any], Any]) -> None:
    global _pending
    module = sys.modules.get(MODULE)
    if module is not None and hasattr(module, "PreTrainedModel"):
        _patch(module, patches, translate)
        return
    _pending = (patches, translate)
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def forget_hf_patches() -> None:
    """The shim is off: a later import of transformers stays untouched."""
    global _pending
    _pending = None
