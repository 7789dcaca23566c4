"""HeteroAuto: cost and memory model, plan search (h2 baseline and auto), simulator, profiler.

`heteropp.auto.plan(problem, budget)` is the entry point (front_door.py); `load_problem` / `make_problem`
build the problem from spec files or loaded specs."""
from __future__ import annotations

from typing import Any

_EXPORTS = {"plan": "front_door", "Budget": "front_door", "PlanResult": "front_door", "DEFAULT_BUDGET": "front_door",
            "Problem": "planning", "load_problem": "planning", "make_problem": "planning"}


def __getattr__(name: str) -> Any:
    """The entry points, imported on first use (the engine imports heteropp.auto's modules without them)."""
    if name in _EXPORTS:
        import importlib
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
