"""The Work object dicomm returns: engine requests plus what must happen once they complete.

torch's own future-wrapping Work cannot honour wait(timeout) nor report a source rank, so this
subclasses `dist._Work`. Waiting happens inside the engine with the GIL released; Python only runs
the completion step (copying results into non-contiguous or device tensors, checking sizes).
"""
from __future__ import annotations

import datetime
import queue
import threading
import time
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

from dicomm import errors

# Works dropped while their requests were in flight (fire-and-forget isend): their buffers must
# outlive the engine's use of them, so they are kept here until their requests finish.
_orphans: list["DicommWork"] = []


def sweep_orphans() -> None:
    """Forgets dropped works whose requests have finished (called before new operations)."""
    _orphans[:] = [w for w in _orphans if not w._requests_done()]


def _finished(request: Any) -> bool:
    try:
        return request.test()
    except Exception:  # failed: finished too
        return True


class DicommWork(dist._Work):
    """Completion handle for one torch.distributed call (one or more engine requests)."""

    # Defaults live on the class so the common path (one send or receive) sets few attributes.
    _finish: Callable[[], None] | None = None  # runs once after every request succeeded
    _expect_nbytes = -1  # a receive must fill its tensor exactly
    _done = False
    _error: BaseException | None = None
    _lock: threading.Lock | None = None  # exists once a future thread may complete this work
    _future: torch.futures.Future | None = None

    def __init__(self, requests: Sequence[Any], result: list[torch.Tensor],
                 finish: Callable[[], None] | None = None, keep: Any = None,
                 expect_nbytes: int = -1) -> None:
        super().__init__()
        self._requests = requests
        self._result = result
        self._keep = keep  # buffers the engine reads or writes until completion
        if finish is not None:
            self._finish = finish
        if expect_nbytes >= 0:
            self._expect_nbytes = expect_nbytes

    # -- completion ---------------------------------------------------------------------------
    def _complete(self, timeout_s: float | None) -> None:
        if self._lock is None:
            self._complete_locked(timeout_s)
        else:
            with self._lock:
                self._complete_locked(timeout_s)

    def _complete_locked(self, timeout_s: float | None) -> None:
        if self._done:
            return
        try:
            if timeout_s is None:
                for r in self._requests:
                    r.wait()
            else:
                deadline = time.monotonic() + timeout_s
                for r in self._requests:
                    r.wait(max(0.0, deadline - time.monotonic()))
            self._keep = None  # every request succeeded: the engine is done with the buffers
            if self._expect_nbytes >= 0:
                got = self._requests[0].nbytes
                if got != self._expect_nbytes:
                    raise _size_error(self._requests[0], got, self._expect_nbytes)
            if self._finish is not None:
                self._finish()
        except errors.TimeoutError as e:
            if not self._requests_done():
                raise  # still in flight (buffers stay referenced): the caller may wait again
            self._error = e  # the engine cancelled it
        except Exception as e:
            self._error = e
        self._done = True

    def _requests_done(self) -> bool:
        """True when the engine is finished with every request (succeeded or failed)."""
        return all(_finished(r) for r in self._requests)

    # -- the torch Work interface -------------------------------------------------------------
    def wait(self, timeout: datetime.timedelta = datetime.timedelta(0)) -> bool:
        if not self._done:
            if self._lock is None:
                self._complete_locked(timeout.total_seconds() if timeout else None)
            else:
                self._complete(timeout.total_seconds() if timeout else None)
        if self._error is not None:
            raise self._error
        return True

    def synchronize(self) -> None:
        self.wait()

    def is_completed(self) -> bool:
        if not self._done and self._requests_done():
            self._complete(None)
        return self._done

    def is_success(self) -> bool:
        return self.is_completed() and self._error is None

    def exception(self) -> BaseException | None:
        return self._error

    def result(self) -> list[torch.Tensor]:
        self.wait()
        return self._result

    def _source_rank(self) -> int:
        return self._requests[0].source

    def source_rank(self) -> int:
        return self._requests[0].source

    def get_future(self) -> torch.futures.Future:
        if self._future is None:
            self._future = torch.futures.Future()
            if self._done:
                _settle(self)
            else:
                self._lock = threading.Lock()
                _completer().put(self)
        return self._future

    def __del__(self) -> None:
        try:
            if self._keep is not None and not self._requests_done():
                _orphans.append(self)
        except Exception:  # interpreter shutdown: nothing left to protect
            pass


def _settle(work: DicommWork) -> None:
    if work._error is not None:
        work._future.set_exception(work._error)
    else:
        work._future.set_result(work._result)


def _size_error(request: Any, got: int, expected: int) -> Exception:
    return errors.MismatchError(
        f"{request.describe()}: received {got} bytes but the tensor holds {expected} bytes; "
        f"the sender's tensor must have the same size as the receiver's")


# One daemon thread per process completes works whose futures were asked for (DDP's comm hooks),
# so the future fires without anyone calling wait(). Works complete in the order they were queued.
_queue: queue.SimpleQueue | None = None
_queue_lock = threading.Lock()


def _completer() -> queue.SimpleQueue:
    global _queue
    with _queue_lock:
        if _queue is None:
            _queue = queue.SimpleQueue()
            threading.Thread(target=_complete_forever, args=(_queue,), name="dicomm-futures",
                             daemon=True).start()
    return _queue


def _complete_forever(q: queue.SimpleQueue) -> None:
    while True:
        work: DicommWork = q.get()
        try:
            work._complete(None)
        except errors.TimeoutError as e:  # report it; the buffers stay referenced
            work._error = e
            work._done = True
        _settle(work)
