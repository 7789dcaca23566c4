"""Host buffers that stand in for tensors the engine cannot address directly.

The engine moves bytes between contiguous host buffers. A CPU tensor that is contiguous is used as
it is; a non-contiguous one goes through a contiguous copy; a tensor on an accelerator goes through
a pinned host buffer (the CPU-mediated path), ordered with the device's current stream: the copy to
the host is queued on that stream and the stream is synchronised before the engine reads the buffer;
received data is copied back on the same stream once the engine has filled the buffer.
"""
from __future__ import annotations

import logging

import torch

log = logging.getLogger("dicomm")
_announced: set[str] = set()


def _announce(device: torch.device) -> None:
    """No silent fallback: say once per device type that its tensors go through host memory."""
    if device.type not in _announced:
        _announced.add(device.type)
        log.info("dicomm: %s tensors take the CPU-mediated path (staged through pinned host "
                 "memory; no device-direct transport for them yet)", device.type)


def _pinned_like(t: torch.Tensor) -> torch.Tensor:
    try:
        return torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    except RuntimeError:  # no accelerator runtime able to pin host memory: pageable still works
        return torch.empty(t.shape, dtype=t.dtype)


class Stager:
    """Host buffers for the tensors of one operation, and the copies that bring results back."""

    __slots__ = ("_back", "_stream", "_pending_sync")

    def __init__(self) -> None:
        self._back: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._stream: torch.Stream | None = None
        self._pending_sync = False

    def _device_stream(self, t: torch.Tensor) -> torch.Stream:
        if self._stream is None:
            _announce(t.device)
            self._stream = torch.accelerator.current_stream(t.device)
        return self._stream

    def input(self, t: torch.Tensor) -> torch.Tensor:
        """A contiguous host tensor holding t's values (t itself when possible)."""
        if t.is_cpu:
            return t if t.is_contiguous() else t.contiguous()
        host = _pinned_like(t)
        self._device_stream(t)
        host.copy_(t, non_blocking=True)
        self._pending_sync = True
        return host

    def output(self, t: torch.Tensor, inout: bool = False) -> torch.Tensor:
        """A contiguous host tensor the engine writes into; finish() copies it into t.

        With inout the buffer also starts with t's values (in-place collectives).
        """
        if t.is_cpu and t.is_contiguous():
            return t
        host = self.input(t) if inout else (
            torch.empty(t.shape, dtype=t.dtype) if t.is_cpu else _pinned_like(t))
        if not t.is_cpu:
            self._device_stream(t)
        self._back.append((t, host))
        return host

    def ready(self) -> None:
        """Waits for queued device-to-host copies; call before the engine touches the buffers."""
        if self._pending_sync:
            self._stream.synchronize()
            self._pending_sync = False

    @property
    def needs_finish(self) -> bool:
        return bool(self._back)

    def finish(self) -> None:
        """Copies results into the caller's tensors (on the stream current when staging began)."""
        if self._stream is None:
            for t, host in self._back:
                t.copy_(host)
        else:
            with self._stream:
                for t, host in self._back:
                    t.copy_(host, non_blocking=not t.is_cpu)
        self._back.clear()
