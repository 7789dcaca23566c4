"""DiComm: point-to-point and collective communication between chips of any vendor."""
from dicomm import _C  # noqa: F401
