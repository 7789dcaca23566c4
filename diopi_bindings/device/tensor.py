"""Tensors of the ``diopi`` device: PrivateUse1 tensors whose memory is a host tensor.

Host memory stands in for device memory: each device tensor holds the host tensor (``.host``) that a
DIOPI library reads and writes through its data pointer, with the same sizes and strides. Every ATen
operator on a device tensor reaches ``__torch_dispatch__`` (below autograd), which the router serves.
"""
from __future__ import annotations

from typing import Any

import torch

from diopi_bindings.device.router import DEVICE_TYPE, Router

_router: Router | None = None


def set_router(router: Router | None) -> None:
    global _router
    _router = router


def current_router() -> Router:
    if _router is None:
        raise RuntimeError("the diopi device is not enabled: call diopi_bindings.device.enable() first")
    return _router


class DiopiTensor(torch.Tensor):
    host: torch.Tensor

    @staticmethod
    def __new__(cls, host: torch.Tensor) -> "DiopiTensor":
        t = torch.Tensor._make_wrapper_subclass(
            cls, host.size(), strides=host.stride(), storage_offset=host.storage_offset(), dtype=host.dtype,
            device=torch.device(DEVICE_TYPE, 0), requires_grad=False)
        t.host = host
        return t

    @property  # type: ignore[override]
    def data(self) -> torch.Tensor:
        return torch.Tensor.data.__get__(self)  # type: ignore[attr-defined]

    @data.setter
    def data(self, new: torch.Tensor) -> None:
        """``p.data = t`` makes p alias t (an optimizer binding parameters to views of one flat buffer): the
        wrapper takes t's sizes and strides from torch, and its memory, the host tensor, here."""
        torch.Tensor.data.__set__(self, new)  # type: ignore[attr-defined]
        if isinstance(new, DiopiTensor):
            self.host = new.host

    def __repr__(self, **kwargs: Any) -> str:  # printing goes through the host copy
        return f"{self.host!r}".replace("tensor(", "diopi_tensor(", 1)

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        return current_router().dispatch(func, args, kwargs or {})


def is_device_tensor(x: Any) -> bool:
    return isinstance(x, DiopiTensor)
