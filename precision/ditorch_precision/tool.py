"""The base of every tool: one dispatch mode (ATen ops, forward and backward), module and step
tracking, selection. Entering a tool installs all of it; leaving removes all of it."""
from __future__ import annotations

import fnmatch
import logging
import threading
from contextlib import ExitStack, nullcontext

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from . import native_hook
from .opinfo import op_info
from .records import OpRecord, callsite
from .selection import Selector, SelectionError, closest, op_aliases
from .tracking import ModuleTracker, RankInfo, StepTracker

log = logging.getLogger("precision")
_NOTHING = nullcontext()


_COMPOSITE = torch._C.DispatchKey.CompositeImplicitAutograd


class _Mode(TorchDispatchMode):
    def __init__(self, tool: "Tool") -> None:
        super().__init__()
        self.tool = tool

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if torch.is_inference_mode_enabled():
            # Without autograd (inference mode) a composite op reaches the mode whole, and an op only
            # autograd handles reaches it at all: run the parts through the mode as autograd's keys do
            # otherwise, and the other unseen, so the ops numbered are the same (and the C++ observer's).
            info = op_info(func)
            if info.autograd_only:
                return func(*args, **kwargs)
            if info.decomposed_on(args, kwargs):  # its C++ kernel, as autograd runs it (not decompose()'s Python ones)
                with self:
                    return func._op_dk(_COMPOSITE, *args, **kwargs)
        return self.tool._dispatch(func, args, kwargs)


class _ApiMode(TorchFunctionMode):
    """Keeps the torch-level call being run (torch functions and Tensor methods): calls made inside
    it are not seen (the mode is off while it handles one), so it is the call the program made."""

    def __init__(self, stack: list) -> None:
        super().__init__()
        self.stack = stack

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = _API_NAMES.get(func)
        if name is None:
            try:
                name = _API_NAMES[func] = torch.overrides.resolve_name(func) or getattr(func, "__name__", str(func))
            except TypeError:  # an unhashable callable: name it, do not cache
                name = getattr(func, "__name__", str(func))
        self.stack.append(name)
        try:
            return func(*args, **(kwargs or {}))
        finally:
            self.stack.pop()


_API_NAMES: dict = {}


_UNSEEN = object()  # an op not yet looked up in Tool._op_hits
_DETACH = torch.ops.aten.detach.default
# Excluded while the dispatcher runs a mode's handler (with the keys above Python), not when torch
# calls the mode directly.
_THROUGH_DISPATCHER = torch._C.DispatchKey.PythonTLSSnapshot


class Tool:
    """Subclasses implement ``handle`` (run the op, do their work, return the outputs) and
    ``finish`` (write results). Use as a context manager; ``step()`` advances the step by hand."""

    name = "tool"
    wants_module_outputs = False  # True: ``on_module_output`` is called whenever a module returns

    def __init__(self, selector: Selector | None = None, *, with_callsite: bool = False, with_api: bool = False,
                 step: int = 0) -> None:
        self.selector = selector or Selector()
        self.with_callsite = with_callsite
        self.with_api = with_api or self.selector.apis is not None  # record the torch-level call of each op
        self._api_stack: list[str] = []
        self._apis_seen: set[str] = set()
        self.modules = ModuleTracker(self.on_module_output if self.wants_module_outputs else None)
        self.steps = StepTracker(step, self.on_step, self.on_optimizer_step, self.on_optimizer_start)
        self.rank = RankInfo()
        self.n_ops = 0
        self._stack: ExitStack | None = None
        self._lock = threading.Lock()
        self._op_hits: dict = {}  # op overload -> selected by name
        self.check_selection = True  # on exit: a pattern that matched nothing raises SelectionError

    # lifecycle -------------------------------------------------------------------------------
    def __enter__(self):
        if self._stack is not None:
            raise RuntimeError(f"{self.name} is already active; a tool can be entered only once at a time")
        self._check_op_patterns()
        stack = ExitStack()
        try:
            stack.enter_context(self.modules)
            stack.enter_context(self.steps)
            self.start()
            stack.callback(self.finish)
            if self.with_api:
                stack.enter_context(_ApiMode(self._api_stack))
            stack.enter_context(self._op_hook())
        except BaseException:
            stack.close()
            raise
        self._stack = stack
        return self

    def __exit__(self, exc_type, *exc) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            stack.close()
        if exc_type is None and self.check_selection:  # never mask the block's own error
            problems = self.unmatched_selection()
            if problems:
                raise SelectionError(f"{self.name}: " + "; ".join(problems))

    def _check_op_patterns(self) -> None:
        """An op pattern that names no operator torch has is a typo: say so before the run."""
        if not self.selector.ops:  # nothing to check: torch's op list (thousands of names) is not read
            return
        known = []
        for name in torch._C._dispatch_get_all_op_names():
            op, _, overload = name.partition(".")
            known.append((op, overload or "default"))
        for pattern in self.selector.ops or ():
            if not any(fnmatch.fnmatchcase(n, pattern) for o in known for n in op_aliases(*o)):
                names = {o for o, _ in known} | {o.partition("::")[2] for o, _ in known}
                raise SelectionError(f"{self.name}: op pattern {pattern!r} matches no operator of torch "
                                     f"{torch.__version__} ({closest(pattern, names)})")

    def unmatched_selection(self) -> list[str]:
        """Patterns of the selector that matched nothing the run did (see ``Selector.unmatched``)."""
        ops_seen = [(info.op, info.overload) for info in map(op_info, self._op_hits)]
        return self.selector.unmatched(ops_seen, self.modules.paths_seen(), self.steps.step, sorted(self._apis_seen))

    def step(self, n: int | None = None) -> None:
        """Advance the step (or set it): for loops without an optimizer."""
        self.steps.step = self.steps.step + 1 if n is None else n
        self.on_step()

    def on_step(self) -> None:
        """Called after every optimizer step (the step counter already advanced)."""

    def on_optimizer_start(self, optimizer) -> None:
        """Called as an optimizer step starts (before its ops)."""

    def on_optimizer_step(self, optimizer) -> None:
        """Called as an optimizer step ends (its ops done; the step counter not yet advanced)."""

    def on_module_output(self, path: str, output) -> None:
        """Called when a module returns (with ``wants_module_outputs``), after its path is popped."""

    def start(self) -> None:
        """Called on entry, before the mode is installed."""

    def finish(self) -> None:
        """Called on exit, after the mode is removed."""

    # dispatch --------------------------------------------------------------------------------
    def _phase(self, in_backward: bool) -> str:
        if self.steps.in_optimizer:
            return "optimizer"
        if in_backward:
            return "recompute" if self.modules.stack else "backward"
        return "forward"

    def _op_selected(self, func) -> bool | None:
        """Whether the op is selected; None for the profiler's own ops (record_function's enter and
        exit), which are not numbered: torch shows them to no RecordFunction observer, so the C++
        hook never sees them, and both hooks number the same ops."""
        hit = self._op_hits.get(func, _UNSEEN)
        if hit is _UNSEEN:
            info = op_info(func)
            hit = self._op_hits[func] = (None if info.op.startswith("profiler::")
                                         else self.selector.op_ok(info.op, info.overload))
        return hit

    def _dispatch(self, func, args, kwargs):
        if func is _DETACH and not torch._C._dispatch_tls_is_dispatch_key_excluded(_THROUGH_DISPATCHER):
            # torch's own shallow copy of a tensor (autograd saving an op's result, ``.data``) asks
            # the active mode for a detach outside the dispatcher: the mode's, not the program's (it
            # does not happen without a mode, and the C++ hook never sees it), so not numbered, nor
            # shown to the tools under this one.
            with self.quiet():
                return func(*args, **kwargs)
        selected = self._op_selected(func)
        if selected is None:
            return func(*args, **kwargs)
        with self._lock:
            index = self.n_ops
            self.n_ops += 1
        # The cheap tests first, and the record only for a selected op: an unselected op costs a
        # few lookups.
        sel = self.selector
        step = self.steps.step
        if not selected or (sel.steps is not None and step not in sel.steps):
            return func(*args, **kwargs)
        rank = self.rank.get()
        if sel.ranks is not None and rank not in sel.ranks:
            return func(*args, **kwargs)
        module, in_backward = self.modules.current()
        phase = self._phase(in_backward)
        if not (sel.module_ok(module) and (sel.phases is None or phase in sel.phases)):
            return func(*args, **kwargs)
        api = None
        if self.with_api and self._api_stack:
            api = self._api_stack[0]
            self._apis_seen.add(api)
        if not sel.api_ok(api):
            return func(*args, **kwargs)
        info = op_info(func)
        rec = OpRecord(index, info.op, info.overload, phase, module, step, rank, api=api)
        if self.with_callsite:
            rec.callsite = callsite()
        return self.handle(rec, func, args, kwargs)

    def _op_hook(self):
        """The context that shows this tool the program's ops: the Python dispatch mode, which
        calls ``_dispatch`` for each (a capture may install its C++ observer instead)."""
        return _Mode(self)

    def handle(self, rec: OpRecord, func, args, kwargs):
        return func(*args, **kwargs)

    @staticmethod
    def quiet():
        """A block whose ops no tool sees: a tool's own copies and checks are not the program's ops
        (the op itself still goes through the outer tools when tools are stacked). Inside a mode's
        own handler that mode is already off, so with no other mode there is nothing to do. A
        capture's C++ observer (native_hook) is paused instead."""
        held = native_hook.paused()
        if torch._C._len_torch_dispatch_stack() == 0:
            return held if held is not None else _NOTHING
        if held is None:
            return _disable_current_modes()
        both = ExitStack()  # a Python tool stacked with a C++-hooked capture: both see nothing
        both.enter_context(held)
        both.enter_context(_disable_current_modes())
        return both
