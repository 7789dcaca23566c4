"""Capture's background writer: a bulk capture's part files are saved on a thread of their own, so
the training thread only hands over what it held (creating and filling a file is most of a
capture's wall time).

The tensors of a part being written are the program's own, uncopied: an op about to write a
storage such a part holds waits until that part is on disk (``wait_for``). Nothing is lost on
exit: ``close`` writes every part handed over, also when the training loop raised."""
from __future__ import annotations

import queue
import threading
from typing import Callable

import torch

from .bulk import storage_address


class WriteError(RuntimeError):
    """A part file could not be written; the message names it."""


class _Part:
    def __init__(self, path: str, payload: dict, storages: set[int]) -> None:
        self.path, self.payload, self.storages = path, payload, storages
        self.done = threading.Event()


class BackgroundWriter:
    """``submit(path, payload, storages)`` saves ``payload`` to ``path`` with ``save`` on a thread;
    ``storages``: the storage addresses of its tensors (see ``wait_for``)."""

    def __init__(self, save: Callable[[dict, str], None]) -> None:
        self._save = save
        self._queue: queue.Queue[_Part | None] = queue.Queue()
        self._in_flight: list[_Part] = []  # submitted, not yet known to be written (training thread only)
        self._error: BaseException | None = None
        self._failed_path = ""
        self._thread = threading.Thread(target=self._run, name="precision-capture-writer", daemon=True)
        self._thread.start()

    def __bool__(self) -> bool:
        """Whether a part may still be being written."""
        if self._in_flight:
            self._in_flight = [p for p in self._in_flight if not p.done.is_set()]
        return bool(self._in_flight)

    def submit(self, path: str, payload: dict, storages: set[int]) -> None:
        self._raise_if_failed()
        part = _Part(path, payload, storages)
        self._in_flight.append(part)
        self._queue.put(part)

    def wait_for(self, written: list[torch.Tensor]) -> None:
        """Before an op writes these tensors: wait for the parts that hold their storages."""
        if not self:
            return
        addresses = {storage_address(t) for t in written if t.layout == torch.strided}
        for part in self._in_flight:
            if part.storages & addresses:
                part.done.wait()
        self._raise_if_failed()

    def close(self) -> None:
        """Write everything submitted, stop the thread; raises WriteError if a part failed."""
        self._queue.put(None)
        self._thread.join()
        self._in_flight = []
        self._raise_if_failed()

    def _run(self) -> None:
        while (part := self._queue.get()) is not None:
            try:
                if self._error is None:  # after a failure the rest is dropped: the capture is broken
                    self._save(part.payload, part.path)
            except BaseException as exc:  # noqa: BLE001 - handed to the training thread
                self._error, self._failed_path = exc, part.path
            finally:
                part.payload = {}  # the program's tensors are not kept alive once written
                part.done.set()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise WriteError(f"capture: writing {self._failed_path} failed ({type(self._error).__name__}: "
                             f"{self._error}); the capture is incomplete") from self._error
