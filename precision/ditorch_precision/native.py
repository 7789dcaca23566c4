"""The package's C++ module (precision/csrc, ``ditorch_precision._C``): the fused statistics pass
and the op observer of a stats capture. Optional: where it did not build (or cannot load into this
torch), ``available()`` is False, ``why_not()`` says why, and the tools use their Python paths."""
from __future__ import annotations

import torch

try:
    from . import _C  # type: ignore[attr-defined]
    _ERROR = ""
except ImportError as exc:  # not built, or built against another torch
    _C = None
    _ERROR = f"{type(exc).__name__}: {exc}"


def available() -> bool:
    return _C is not None


def why_not() -> str:
    """Why the C++ module is not loaded ("" when it is)."""
    return _ERROR


def fused_stats(t: torch.Tensor) -> tuple | None:
    """(numel, nan, inf, finite, min, max, sum, sum of squares) of a CPU tensor in one pass over its
    elements in its own dtype, float64 accumulators, no copy; None where the module is missing or
    the tensor is not a strided CPU tensor of a floating or integer dtype."""
    if _C is None or t.device.type != "cpu":
        return None
    return _C.fused_stats(t)


def op_observer():
    """A new C++ op observer (see ``capture``), its dtype names set as the index writes them."""
    if _C is None:
        raise RuntimeError(f"ditorch_precision's C++ module is not available ({_ERROR})")
    obs = _C.OpObserver()
    for dtype in _DTYPES:
        obs.set_dtype_name(dtype, str(dtype).removeprefix("torch."))
    return obs


_DTYPES = [d for d in vars(torch).values() if isinstance(d, torch.dtype)]
