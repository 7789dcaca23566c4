"""overflow_check: the first op whose outputs hold Inf/NaN (or values beyond a dtype's range)
although its inputs did not, with its module path and call stack."""
from __future__ import annotations

import json
import math
import os
import logging
from dataclasses import asdict, dataclass, field

import torch
from torch.utils._pytree import tree_leaves

from .records import OpRecord, user_stack
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


def _nonfinite_scalars(tree) -> bool:
    return any(isinstance(x, float) and not math.isfinite(x) for x in tree_leaves(tree))


def _floats(tree) -> list[torch.Tensor]:
    return [t for t in tree_leaves(tree) if isinstance(t, torch.Tensor) and t.dtype.is_floating_point and t.numel()]


class OverflowCheck(Tool):
    """``with OverflowCheck() as oc: train()`` then ``oc.first``: the first op that produced Inf/NaN
    from finite inputs (tensors and scalars); ``events`` holds every such op, in order. Ops that
    only pass on an Inf they were given are not events.

    ``range_dtype``: also flag finite values beyond that dtype's largest value (e.g. float16 for a
    float32 run that will later be trained in float16). ``raise_on_first``: stop the run there."""

    name = "overflow_check"

    def __init__(self, selector: Selector | None = None, *, range_dtype: torch.dtype | None = None,
                 raise_on_first: bool = False, out: str | None = None, max_events: int = 100, **kwargs) -> None:
        super().__init__(selector, **kwargs)
        self.range_max = torch.finfo(range_dtype).max if range_dtype is not None else None
        self.raise_on_first = raise_on_first
        self.out = out
        self.max_events = max_events
        self.events: list[OverflowEvent] = []

    @property
    def first(self) -> OverflowEvent | None:
        return self.events[0] if self.events else None

    def _problem(self, tensors: list[torch.Tensor]) -> tuple[str, str] | None:
        for i, t in enumerate(tensors):
            if not bool(torch.isfinite(t).all()):
                n_nan, n_inf = int(t.isnan().sum()), int(t.isinf().sum())
                return ("nan" if n_nan else "inf"), f"output {i}: {n_nan} NaN, {n_inf} Inf of {t.numel()}"
            if self.range_max is not None:
                peak = float(t.abs().max())
                if peak > self.range_max:
                    return "range", f"output {i}: |max| {peak:.4g} exceeds {self.range_max:.4g}"
        return None

    def handle(self, rec: OpRecord, func, args, kwargs):
        # An Inf scalar argument (an attention mask's -inf) is given, not produced. Checked before
        # the op: in-place ops overwrite their inputs.
        with self.quiet():
            inputs_ok = self._problem(_floats((args, kwargs))) is None and not _nonfinite_scalars((args, kwargs))
        out = func(*args, **kwargs)
        if inputs_ok and len(self.events) < self.max_events:
            with self.quiet():
                problem = self._problem(_floats(out))
            if problem is not None:
                event = OverflowEvent(rec.index, rec.op, rec.phase, rec.module, rec.step, rec.rank, *problem,
                                      inputs_finite=inputs_ok, stack=user_stack(12))
                self.events.append(event)
                if len(self.events) == 1:
                    log.warning("overflow_check: %s", OverflowDetected(event))
                if self.raise_on_first:
                    raise OverflowDetected(event)
        return out

    def finish(self) -> None:
        if self.out:
            path = self.out.format(rank=self.rank.get())
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            with open(path, "w") as f:
                json.dump({"first": self.first.to_dict() if self.first else None,
                           "events": [e.to_dict() for e in self.events]}, f, indent=1)
