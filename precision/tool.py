"""The base of every tool: one dispatch mode (ATen ops, forward and backward), module and step
tracking, selection. Entering a tool installs all of it; leaving removes all of it."""
from __future__ import annotations

import logging
import threading
from contextlib import ExitStack

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from .records import OpRecord, callsite, op_names
from .selection import Selector
from .tracking import ModuleTracker, RankInfo, StepTracker

log = logging.getLogger("precision")


class _Mode(TorchDispatchMode):
    def __init__(self, tool: "Tool") -> None:
        super().__init__()
        self.tool = tool

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return self.tool._dispatch(func, args, kwargs or {})


class Tool:
    """Subclasses implement ``handle`` (run the op, do their work, return the outputs) and
    ``finish`` (write results). Use as a context manager; ``step()`` advances the step by hand."""

    name = "tool"

    def __init__(self, selector: Selector | None = None, *, with_callsite: bool = False, step: int = 0) -> None:
        self.selector = selector or Selector()
        self.with_callsite = with_callsite
        self.modules = ModuleTracker()
        self.steps = StepTracker(step, self.on_step)
        self.rank = RankInfo()
        self.n_ops = 0
        self._stack: ExitStack | None = None
        self._lock = threading.Lock()

    # lifecycle -------------------------------------------------------------------------------
    def __enter__(self):
        if self._stack is not None:
            raise RuntimeError(f"{self.name} is already active; a tool can be entered only once at a time")
        stack = ExitStack()
        try:
            stack.enter_context(self.modules)
            stack.enter_context(self.steps)
            self.start()
            stack.callback(self.finish)
            stack.enter_context(_Mode(self))
        except BaseException:
            stack.close()
            raise
        self._stack = stack
        return self

    def __exit__(self, *exc) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            stack.close()

    def step(self, n: int | None = None) -> None:
        """Advance the step (or set it): for loops without an optimizer."""
        self.steps.step = self.steps.step + 1 if n is None else n
        self.on_step()

    def on_step(self) -> None:
        """Called after every optimizer step (the step counter already advanced)."""

    def start(self) -> None:
        """Called on entry, before the mode is installed."""

    def finish(self) -> None:
        """Called on exit, after the mode is removed."""

    # dispatch --------------------------------------------------------------------------------
    def _record(self, func) -> OpRecord:
        op, overload = op_names(func)
        with self._lock:
            index = self.n_ops
            self.n_ops += 1
        module, in_backward = self.modules.current()
        if self.steps.in_optimizer:
            phase = "optimizer"
        elif in_backward:
            phase = "recompute" if self.modules.stack else "backward"
        else:
            phase = "forward"
        return OpRecord(index, op, overload, phase, module, self.steps.step, self.rank.get())

    def _dispatch(self, func, args, kwargs):
        rec = self._record(func)
        if rec.op.startswith("profiler::") or not self.selector.matches(rec.op, rec.overload, rec.module, rec.step, rec.rank, rec.phase):
            return func(*args, **kwargs)
        if self.with_callsite:
            rec.callsite = callsite()
        return self.handle(rec, func, args, kwargs)

    def handle(self, rec: OpRecord, func, args, kwargs):
        return func(*args, **kwargs)

    @staticmethod
    def quiet():
        """A block whose ops no tool sees: a tool's own copies and checks are not the program's ops
        (the op itself still goes through the outer tools when tools are stacked)."""
        return _disable_current_modes()
