"""DiComm: point-to-point and collective communication between chips of any vendor.

Importing the package registers the torch.distributed backend "dicomm"; torch's backend autoload
entry point does the same at `import torch`, so `dist.init_process_group(backend="dicomm")` works
without importing dicomm first.
"""
import warnings

from dicomm import _C as _C  # noqa: F401  (the engine; loads before the backend)
from dicomm.errors import DicommError, MismatchError, PeerError, TimeoutError

try:
    from dicomm.backend import BACKEND_NAME, DicommBackend, register
except ImportError as e:  # dicomm._C_torch missing or built against another torch
    # torch imports this package at `import torch` (autoload), which must never fail: say why
    # the backend is missing instead.
    warnings.warn(f"dicomm: the torch.distributed backend is unavailable ({e}); rebuild dicomm "
                  f"against the installed torch (make setup)", RuntimeWarning, stacklevel=2)

__all__ = ["BACKEND_NAME", "DicommBackend", "register", "DicommError", "MismatchError",
           "PeerError", "TimeoutError"]
