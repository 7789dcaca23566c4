"""torch.compile's inductor on the diopi device: a clear refusal instead of an assertion deep in inductor.

Inductor generates kernels per device type and finds a PrivateUse1 device's code generators as attributes
of its device module (``Scheduling``, ``PythonWrapperCodegen``, ``CppWrapperCodegen``). A DIOPI library
is a set of compiled operators, not a compiler, so the diopi device has none: these stand-ins are
registered in their place and refuse when inductor first asks for a kernel of the device, naming the
way out. Graphs without diopi tensors never construct them, so inductor keeps working for the CPU.
"""
from __future__ import annotations

from typing import Any

MESSAGE = ('torch.compile\'s inductor has no code generator for the diopi device (a DIOPI library ships '
           'operators, not a compiler): compile with backend="aot_eager" (the graph\'s ATen operators run on the '
           'device, through the library) or run eagerly')


class InductorUnsupported(Exception):
    """Inductor was asked to generate code for the diopi device. Not a RuntimeError: inductor swallows those
    while it looks up a device's code generators."""


class _Refused:
    supports_caching = False  # read before any code is generated

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise InductorUnsupported(MESSAGE)

    @classmethod
    def create(cls, *args: Any, **kwargs: Any) -> Any:
        raise InductorUnsupported(MESSAGE)


class Scheduling(_Refused):
    pass


class PythonWrapperCodegen(_Refused):
    pass


class CppWrapperCodegen(_Refused):
    pass


class WrapperFxCodegen(_Refused):
    pass
