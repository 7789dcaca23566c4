"""Turning ditorch off as a whole: the CUDA compatibility layer first, then the device name under it.

It lives above both layers so that the shim never needs to know about the compatibility layer.
"""
from __future__ import annotations

from ditorch import shim
from ditorch.cuda_compat import disable_cuda_compat


def disable() -> None:
    """Restore torch exactly: undo every patch and remove the mode from this thread's stack."""
    with shim.state_lock():
        disable_cuda_compat()
        shim.disable_device_name()
