"""The engine's exception classes, as Python sees them.

DicommError is a RuntimeError; TimeoutError, PeerError and MismatchError derive from it. An engine
built without them (early development) still lets the package import, with RuntimeError stand-ins.
"""
from __future__ import annotations

from dicomm import _C

DicommError: type[RuntimeError] = getattr(_C, "DicommError", RuntimeError)
TimeoutError: type[RuntimeError] = getattr(_C, "TimeoutError", type("TimeoutError", (DicommError,), {}))
PeerError: type[RuntimeError] = getattr(_C, "PeerError", type("PeerError", (DicommError,), {}))
MismatchError: type[RuntimeError] = getattr(_C, "MismatchError",
                                            type("MismatchError", (DicommError,), {}))

__all__ = ["DicommError", "TimeoutError", "PeerError", "MismatchError"]
