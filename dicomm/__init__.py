"""DiComm: point-to-point and collective communication between chips of any vendor.

Importing the package registers the torch.distributed backend "dicomm"; torch's backend autoload
entry point does the same at `import torch`, so `dist.init_process_group(backend="dicomm")` works
without importing dicomm first.
"""
from dicomm import _C  # noqa: F401
from dicomm.backend import BACKEND_NAME, DicommBackend, register
from dicomm.errors import DicommError, MismatchError, PeerError, TimeoutError

__all__ = ["BACKEND_NAME", "DicommBackend", "register", "DicommError", "MismatchError",
           "PeerError", "TimeoutError"]
