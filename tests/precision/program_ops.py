"""The ATen ops a program calls, as the tests' own dispatch modes (independent references of the
tools' op numbering) count them: not the detach torch asks a mode for outside the dispatcher when it
makes a shallow copy of a tensor (autograd saving a result, ``.data``), which the program without a
mode never calls (the C++ op observer, a RecordFunction callback, never sees one:
test_precision_hook_sequences)."""
import torch
from torch.utils._python_dispatch import TorchDispatchMode

_DETACH = torch.ops.aten.detach.default


def called_by_program(func) -> bool:
    """Whether the call a mode is handling is one of the program's (the dispatcher runs a mode's
    handler with PythonTLSSnapshot excluded; torch's direct call of the mode's detach does not)."""
    return func is not _DETACH or torch._C._dispatch_tls_is_dispatch_key_excluded(
        torch._C.DispatchKey.PythonTLSSnapshot)


class OpLog(TorchDispatchMode):
    """An independent op counter: the ATen op names the program calls, in call order."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if called_by_program(func):
            self.ops.append(func._schema.name)
        return func(*args, **(kwargs or {}))
