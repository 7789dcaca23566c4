"""The torch-function mode strategy: one mode on the thread's torch-function stack sees every
torch call, including ones bound before ``import ditorch`` (``from torch import zeros``).

It costs a Python call per torch operation (about 2 us on a desktop CPU), so the default strategy
is the patch one (``ditorch/patching.py``); the mode remains for code the patches cannot reach.
"""
from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from ditorch.translate import DEVICE_CLASSES, MISS, SAME, DeviceTranslator

# Calls that take a device positionally: Tensor.to("device"), nn.Module.to -> _parse_to("device"),
# Tensor.cuda(i) (CUDA compatibility only). Everything else takes it as the `device=` keyword.
_TO = torch.Tensor.to
_PARSE_TO = torch._C._nn._parse_to
_CUDA = torch.Tensor.cuda
_PINNING = {torch.Tensor.pin_memory: "pin_memory", torch.Tensor.is_pinned: "is_pinned"}


class DeviceMode(TorchFunctionMode):
    """Rewrites device arguments naming the unified device (or CUDA, in compatibility mode)."""

    def __init__(self, translator: DeviceTranslator) -> None:
        super().__init__()
        self.translator = translator

    def _positional_call(self, func: Any, args: tuple, kwargs: dict[str, Any] | None) -> Any:
        tr = self.translator
        kwargs = dict(kwargs) if kwargs else {}
        dev = kwargs.get("device")
        if dev is not None and dev.__class__ in DEVICE_CLASSES:
            new = tr.lookup(dev)
            if new is not SAME:
                kwargs["device"] = new
        if func is _CUDA:
            if not tr.cuda_compat:
                return func(*args, **kwargs)
            return tr.cuda_call(_TO, args[0], args[1:], kwargs)
        pos = 1 if func is _TO else 0
        if len(args) > pos and args[pos].__class__ in DEVICE_CLASSES:
            new = tr.lookup(args[pos])
            if new is not SAME:
                args = (*args[:pos], new, *args[pos + 1 :])
        return func(*args, **kwargs)

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func is _TO or func is _PARSE_TO or func is _CUDA:
            return self._positional_call(func, args, kwargs)
        if func in _PINNING:  # Tensor.pin_memory("device"), Tensor.is_pinned("device")
            from ditorch.patching import PIN_ON_CPU, _pinning

            with torch._C.DisableTorchFunction():
                return _pinning(func, self.translator, PIN_ON_CPU[_PINNING[func]])(*args, **(kwargs or {}))
        if kwargs:
            dev = kwargs.get("device")
            if dev is not None and dev.__class__ in DEVICE_CLASSES:
                new = self.translator.cache.get(dev, MISS)
                if new is MISS:
                    new = self.translator.lookup(dev)
                if new is not SAME:
                    kwargs = dict(kwargs)
                    kwargs["device"] = new
            return func(*args, **kwargs)
        return func(*args)
