"""The one schedule registry: name -> action-list generator, activations a stage holds at its peak, whether
weight gradients are deferred, and the parameters the schedule takes. The engine, the simulator, the cost
model, the plan validator and the command lines all look schedules up here.

H-1F1B (HARP): 1F1B with extra warm-up forwards in front of slow boundaries, so that a stage keeps
computing while activations and gradients cross a link. `extra_warmup[j]` micro-batches more are in flight
across boundary j; stage s runs sum_{j >= s} (1 + extra_warmup[j]) warm-up forwards (1F1B: p - 1 - s) and
so holds that many plus one micro-batches' activations at its peak.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from .actions import Schedule, ScheduleError
from .generators import gpipe, h_1f1b, interleaved_1f1b, zb_h1

Params = Mapping[str, Any]


def _warmups(p: int, params: Params) -> list[int]:
    """Stage s's warm-up forwards: sum_{j >= s} (1 + extra_warmup[j]) (suffix sums: the cost model asks
    for every stage of long pipelines)."""
    extra = list(params.get("extra_warmup") or [0] * max(p - 1, 0))
    suffix = [0] * (len(extra) + 1)
    for j in reversed(range(len(extra))):
        suffix[j] = suffix[j + 1] + 1 + extra[j]
    return [suffix[s] if s < len(extra) else 0 for s in range(p)]


INTERLEAVED_CHUNKS = 1  # interleaved 1F1B's chunks where a plan omits them (Plan.chunks reads it through defaults)


def _interleaved_in_flight(k: int, p: int, b: int, v: int) -> int:
    return math.ceil(min((p - k - 1) * 2 + (v - 1) * p + 1, b * v) / v)


@dataclass(frozen=True)
class ScheduleKind:
    name: str
    build: Callable[[int, int, Params], Schedule]  # (stages, micro-batches, params) -> compute actions
    in_flight: Callable[[int, int, int, Params], int]  # (stage, stages, micro-batches, params) -> activations held
    defers_weight_grads: bool
    params: tuple[str, ...] = ()
    searched_as: str = ""  # the parameter-free schedule the planner searches with (the plan then derives params)
    # after its warm-up a stage alternates one forward and one whole backward, so its next forward waits for a
    # backward to come back (the cost model's round-trip cycles)
    alternates: bool = False
    # how many forwards stage k runs before one of them must wait for a backward (warm-up plus one); None:
    # the in-flight count (they differ where deferred weight passes hold activations longer)
    round_trip_span: Callable[[int, int, int, Params], int] | None = None
    # weight passes stage k holds back: after its backward y >= hold it runs weight pass y - hold, and the last
    # ones after its last backward (the cost model's cycles and drain)
    held_weight_passes: Callable[[int, int, int, Params], int] | None = None
    # every stage runs all its forwards before any backward: fill and drain are two whole passes
    whole_passes: bool = False
    defaults: Mapping[str, Any] = field(default_factory=dict)  # a parameter's value where a plan omits it

    def param(self, params: Params, name: str) -> Any:
        """`name` from `params`, else this schedule's default for it."""
        return params[name] if name in params else self.defaults[name]

    def chunks(self, params: Params) -> int:
        """Model chunks per group of chips (virtual stages per stage): 1 unless the schedule interleaves (or
        its value is malformed, which params_error reports)."""
        c = self.param(params, "chunks") if "chunks" in self.params else 1
        return c if isinstance(c, int) and not isinstance(c, bool) and c >= 1 else 1


REGISTRY: dict[str, ScheduleKind] = {k.name: k for k in (
    ScheduleKind("1f1b", lambda p, m, _: h_1f1b(p, m, [0] * max(p - 1, 0)), lambda k, p, b, _: min(p - k, b), False,
                 alternates=True),
    ScheduleKind("gpipe", lambda p, m, _: gpipe(p, m), lambda k, p, b, _: b, False, whole_passes=True),
    # up to p - k awaiting B/I plus up to k awaiting their deferred W
    ScheduleKind("zbh1", lambda p, m, _: zb_h1(p, m), lambda k, p, b, _: min(p, b), True, alternates=True,
                 round_trip_span=lambda k, p, b, _: min(p - k, b),
                 held_weight_passes=lambda k, p, b, _: min(k, b)),
    ScheduleKind("h1f1b", lambda p, m, q: h_1f1b(p, m, list(q.get("extra_warmup") or [0] * max(p - 1, 0))),
                 lambda k, p, b, q: min(_warmups(p, q)[k] + 1, b), False, ("extra_warmup",), "1f1b", alternates=True),
    # a stage's chunks hold 1/v of its layers each: its peak, in whole-stage activations, is the warm-up
    # micro-steps plus one over v
    ScheduleKind("interleaved", lambda p, m, q: interleaved_1f1b(p, m, q.get("chunks", INTERLEAVED_CHUNKS)),
                 lambda k, p, b, q: _interleaved_in_flight(k, p, b, q.get("chunks", INTERLEAVED_CHUNKS)),
                 False, ("chunks",), "1f1b", defaults={"chunks": INTERLEAVED_CHUNKS}),
)}
NAMES = tuple(REGISTRY)


def kind(name: str) -> ScheduleKind:
    if name not in REGISTRY:
        raise ScheduleError(f"unknown schedule {name!r}; expected one of {', '.join(NAMES)}")
    return REGISTRY[name]


def build(name: str, p: int, m: int, params: Params | None = None) -> Schedule:
    """The compute actions of the registered schedule `name` with its parameters."""
    return kind(name).build(p, m, params or {})


def missing_params(name: str, params: Params) -> list[str]:
    """The parameters schedule `name` takes, has no default for, and `params` lacks (a run or a simulation
    needs them all)."""
    k = kind(name)
    return [n for n in k.params if n not in params and n not in k.defaults]


def params_error(name: str, params: Any, stages: int) -> str | None:
    """Why `params` do not fit schedule `name` on `stages` stages, or None."""
    if not isinstance(params, dict):
        return f"schedule_params must be a mapping, got {type(params).__name__}"
    k = kind(name)
    extra = sorted(set(params) - set(k.params))
    if extra:
        return f"schedule {name!r} takes no parameter {extra[0]!r} (it takes: {', '.join(k.params) or 'none'})"
    if "chunks" in params and (not isinstance(params["chunks"], int) or isinstance(params["chunks"], bool)
                               or params["chunks"] < 1):
        return f"chunks must be an integer >= 1 (model chunks per stage), got {params['chunks']!r}"
    if "extra_warmup" in params:
        x = params["extra_warmup"]
        if (not isinstance(x, list) or len(x) != stages - 1
                or any(not isinstance(v, int) or isinstance(v, bool) or v < 0 for v in x)):
            return f"extra_warmup must list {stages - 1} integers >= 0, one per boundary, got {x!r}"
    return None


def h1f1b_extra(compute_s: list[float], boundary_s: list[float]) -> list[int]:
    """HARP's rule: across boundary j, ceil(round trip / bottleneck compute) more micro-batches in flight,
    the round trip being the activation's and the gradient's transfer (2 e_j) and the bottleneck compute
    the slowest stage's forward and backward of one micro-batch."""
    c = max(compute_s) if compute_s else 0.0
    return [math.ceil(2 * e / c - 1e-9) if c > 0 else 0 for e in boundary_s]


def harp_launch_extra(compute_s: list[float], boundary_s: list[float], crosses: list[bool]) -> list[int]:
    """The extra warm-up HARP's code launches with (github.com/Lssyes/harp,
    harp_patches/alpa/pipeline_parallel/stage_construction.py, commit 01b14b0c6413dfb2270e1cdc79d4e3f60fb5fcd0,
    training_dp_hetero_impl): a stage warms up one step more than the next one inside a cluster (1F1B: no
    extra), and 1, 2 or 3 more across a cluster boundary as the boundary's cost is below a tenth of the
    stage-cost cap, below half of it, or above (extra 0, 1, 2). The cap is at least every stage's cost and
    every boundary's (the search skips what exceeds it); here it is the largest of them. `boundary_s`: each
    boundary's cost (transfer and latency), `crosses`: whether it joins two clusters."""
    cap = max([*compute_s, *boundary_s], default=0.0)
    return [0 if not x or cap <= 0 else 0 if e < 0.1 * cap else 1 if e < 0.5 * cap else 2
            for e, x in zip(boundary_s, crosses)]
