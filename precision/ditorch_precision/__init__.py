"""precision: operator precision alignment against a reference device.

Tools (context managers; each restores torch on exit): Capture, AutoCompare, OverflowCheck,
OpTimer, DtypeCast, Fallback. Offline: compare_dumps, replay, loss_check. The comparison rules
live in ditorch_precision.metrics. Setting PRECISION_TOOL activates tools at import (see ditorch_precision.env).

Names load on first use, so the loss check (pure Python) does not pay for importing torch."""
from __future__ import annotations

import importlib
import os

_EXPORTS = {
    "AutoCompare": "autocompare", "Capture": "capture", "DtypeCast": "cast", "Fallback": "cast",
    "DiffReport": "diff", "compare_dumps": "diff", "Dump": "dump", "DumpError": "dump",
    "DEFAULT_THRESHOLD": "loss", "LossInputError": "loss", "LossReport": "loss", "loss_check": "loss",
    "read_loss_file": "loss", "write_loss_file": "loss", "Tolerance": "metrics", "Verdict": "metrics",
    "compare_tensors": "metrics", "default_tolerance": "metrics", "error_stats": "metrics", "OpTimer": "op_timer",
    "OverflowCheck": "overflow", "OverflowDetected": "overflow", "OpRecord": "records", "replay": "replay",
    "Selector": "selection", "Tool": "tool",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'precision' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


if os.environ.get("PRECISION_TOOL"):
    from . import env as _env

    _env.activate_from_env()
