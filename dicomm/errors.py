"""The engine's exception classes, as Python sees them.

DicommError is a RuntimeError; TimeoutError, PeerError and MismatchError derive from it. What the
torch backend raises is also a `torch.distributed.DistBackendError` (what torch users catch for
any backend): one class per kind derives from both (BACKEND_ERRORS, used by `dicomm._C_torch`).
"""
from __future__ import annotations

from torch.distributed import DistBackendError

import dicomm._C as _C

DicommError: type[RuntimeError] = _C.DicommError
TimeoutError: type[RuntimeError] = _C.TimeoutError
PeerError: type[RuntimeError] = _C.PeerError
MismatchError: type[RuntimeError] = _C.MismatchError
ValueError: type[Exception] = _C.ValueError  # also a builtins.ValueError


def _backend_class(base: type[Exception]) -> type[Exception]:
    return type(base.__name__, (base, DistBackendError), {"__module__": "dicomm"})


BACKEND_ERRORS: dict[str, type[Exception]] = {
    "generic": _backend_class(DicommError), "timeout": _backend_class(TimeoutError),
    "peer": _backend_class(PeerError), "mismatch": _backend_class(MismatchError),
    "value": _backend_class(ValueError),
}

__all__ = ["DicommError", "TimeoutError", "PeerError", "MismatchError", "ValueError"]
