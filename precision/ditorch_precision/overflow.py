"""overflow_check: the first op whose outputs hold Inf/NaN (or values beyond a dtype's range)
although its inputs did not, with its module path and call stack.

Per op, only the outputs are screened (one reduction each, see ditorch_precision.finite); the inputs are
looked at only when an output fires, except for ops that write an argument, whose inputs are
screened before they run. Ops that only move values (views, copies, indexing) are not checked:
from finite inputs they cannot make Inf/NaN."""
from __future__ import annotations

import json
import os
import logging
from dataclasses import asdict, dataclass, field

import torch

from .collectives import is_collective, wait_collective
from .finite import VALUE_PRESERVING, device_stats, first_problem, floats, nonfinite_scalars, read_stats, stats_problem
from .opinfo import op_info
from .records import OpRecord, format_frames, user_frames
from .reference import UNINITIALISED
from .selection import Selector
from .tool import Tool

log = logging.getLogger("precision")


class OverflowDetected(RuntimeError):
    def __init__(self, event: "OverflowEvent") -> None:
        super().__init__(f"{event.kind} first produced by {event.op} #{event.index} ({event.phase}, module "
                         f"{event.module}, step {event.step}): {event.detail}")
        self.event = event


@dataclass
class OverflowEvent:
    index: int
    op: str
    phase: str
    module: str | None
    step: int
    rank: int
    kind: str  # "nan", "inf" or "range"
    detail: str
    inputs_finite: bool
    stack: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


# No-sync mode: ops queued before the queue is read (one synchronisation) at the latest.
_QUEUE_LIMIT = 4096


class OverflowCheck(Tool):
    """``with OverflowCheck() as oc: train()`` then ``oc.first``: the first op that produced Inf/NaN
    from finite inputs (tensors and scalars); ``events`` holds every such op, in order. Ops that
    only pass on an Inf they were given are not events.

    ``range_dtype``: also flag finite values beyond that dtype's largest value (e.g. float16 for a
    float32 run that will later be trained in float16). ``raise_on_first``: stop the run there.
    ``sync=False``: no host read per op; each op's NaN/Inf counts stay on the device and are read
    together after each optimizer step (or ``flush()``, or on exit), so events (and a raise) come
    at that point, with the same op, module, detail and stack."""

    name = "overflow_check"

    def __init__(self, selector: Selector | None = None, *, range_dtype: torch.dtype | None = None,
                 raise_on_first: bool = False, out: str | None = None, max_events: int = 100, sync: bool = True,
                 **kwargs) -> None:
        super().__init__(selector, **kwargs)
        self.range_max = torch.finfo(range_dtype).max if range_dtype is not None else None
        self.raise_on_first = raise_on_first
        self.out = out
        self.max_events = max_events
        self.sync = sync
        self.events: list[OverflowEvent] = []
        self._queue: list = []

    @property
    def first(self) -> OverflowEvent | None:
        return self.events[0] if self.events else None

    def _skips(self, func) -> bool:
        # Uninitialised memory (aten::empty and friends) may hold anything: not an overflow. With a
        # range bound a given constant can exceed it, so only views are skipped then.
        info = op_info(func)
        return (info.is_view or info.op in UNINITIALISED
                or (self.range_max is None and info.op in VALUE_PRESERVING))

    @staticmethod
    def _read_inputs(func, args, kwargs):
        out_names = op_info(func).out_names
        if out_names:  # out= buffers are only written: what they held before is no input
            kwargs = {k: v for k, v in kwargs.items() if k not in out_names}
        return args, kwargs

    def _inputs_bad(self, func, args, kwargs) -> bool:
        inputs = self._read_inputs(func, args, kwargs)
        return first_problem(floats(inputs), self.range_max) is not None or nonfinite_scalars(inputs)

    def handle(self, rec: OpRecord, func, args, kwargs):
        if len(self.events) >= self.max_events or self._skips(func):
            return func(*args, **kwargs)
        if not self.sync:
            return self._handle_queued(rec, func, args, kwargs)
        # An op that writes an argument may overwrite its own input: its inputs are checked first.
        # Other ops leave their inputs as they were: those are checked only if an output fires.
        early = op_info(func).mutates
        inputs_bad = False
        if early:
            with self.quiet():
                inputs_bad = self._inputs_bad(func, args, kwargs)
        out = func(*args, **kwargs)
        if is_collective(rec.op):  # its outputs hold the result only once it completed
            wait_collective(out, rec.op)
        if inputs_bad:
            return out
        with self.quiet():
            problem = first_problem(floats(out), self.range_max)
            if problem is not None and not early and self._inputs_bad(func, args, kwargs):
                problem = None
        if problem is not None:
            self._event(rec, problem, format_frames(user_frames(12, skip=1)))
        return out

    def _event(self, rec: OpRecord, problem: tuple[str, str], stack: list[str]) -> None:
        event = OverflowEvent(rec.index, rec.op, rec.phase, rec.module, rec.step, rec.rank, *problem,
                              inputs_finite=True, stack=stack)
        self.events.append(event)
        if len(self.events) == 1:
            log.warning("overflow_check: %s", OverflowDetected(event))
        if self.raise_on_first:
            raise OverflowDetected(event)

    # no-sync mode ----------------------------------------------------------------------------
    def _stats(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        return [device_stats(t, self.range_max) for t in tensors]

    def _handle_queued(self, rec: OpRecord, func, args, kwargs):
        early = op_info(func).mutates
        with self.quiet():
            scalars_bad = nonfinite_scalars((args, kwargs))
            inputs = self._stats(floats(self._read_inputs(func, args, kwargs))) if early else None
        out = func(*args, **kwargs)
        with self.quiet():
            outputs = floats(out)
            if inputs is None:
                inputs = self._stats(floats(self._read_inputs(func, args, kwargs)))
            self._queue.append((rec, scalars_bad, len(inputs), [t.numel() for t in outputs],
                                inputs + self._stats(outputs), user_frames(12, skip=2)))
        if len(self._queue) >= _QUEUE_LIMIT:
            self.flush()
        return out

    def flush(self) -> None:
        """Read the queued ops' counts (one synchronisation) and record their events, in order."""
        queue, self._queue = self._queue, []
        with self.quiet():  # also called from an optimizer hook, where the mode is active
            values = iter(read_stats([r for *_, rows, _ in queue for r in rows]))
        for rec, scalars_bad, n_in, numels, _rows, frames in queue:
            ins = [next(values) for _ in range(n_in)]
            outs = [next(values) for _ in numels]
            if scalars_bad or len(self.events) >= self.max_events:
                continue
            if any(stats_problem(row, 0, 0, self.range_max) for row in ins):
                continue
            problem = next((p for i, (row, n) in enumerate(zip(outs, numels))
                            if (p := stats_problem(row, i, n, self.range_max))), None)
            if problem is not None:
                self._event(rec, problem, format_frames(frames))

    def on_step(self) -> None:
        if not self.sync:
            self.flush()

    def finish(self) -> None:
        if self._queue:
            self.flush()
        if self.out:
            path = self.out.format(rank=self.rank.get())
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            with open(path, "w") as f:
                json.dump({"first": self.first.to_dict() if self.first else None,
                           "events": [e.to_dict() for e in self.events]}, f, indent=1)
