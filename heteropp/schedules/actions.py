"""Pipeline schedules as per-stage lists of actions, the representation shared by the engine and the simulator.

Compute actions: F (forward), B (full backward), I (input-gradient backward), W (weight-gradient backward).
Communication actions: SEND_F/RECV_F (activations to/from the next/previous stage) and SEND_B/RECV_B
(gradients). A schedule is `list[list[Action]]`, one list per stage in execution order.

Interleaved schedules give a stage several model chunks (virtual stages): an action's `chunk` c on stage s
is virtual stage c * p + s of p * v, and the pipeline runs through the virtual stages in order (stage p - 1's
chunk c feeds stage 0's chunk c + 1). Every schedule without chunks has v = 1 and virtual stage = stage.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Op(str, Enum):
    """What an action does. A str as well (Op.F == "F", the same hash), so that tables keyed by the letters
    and plans, timelines and JSON written with them read the same."""
    F = "F"  # forward
    B = "B"  # full backward
    I = "I"  # noqa: E741 (the schedules' name): input-gradient backward
    W = "W"  # weight-gradient backward
    SEND_F = "SEND_F"
    RECV_F = "RECV_F"
    SEND_B = "SEND_B"
    RECV_B = "RECV_B"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


COMPUTE = (Op.F, Op.B, Op.I, Op.W)
COMM = (Op.SEND_F, Op.RECV_F, Op.SEND_B, Op.RECV_B)


@dataclass(frozen=True)
class Action:
    op: Op  # a letter ("F") is taken and made the Op; any other string is refused here
    mb: int
    chunk: int = 0  # the stage's model chunk (interleaved schedules)

    def __post_init__(self) -> None:
        if type(self.op) is not Op:
            try:
                object.__setattr__(self, "op", Op(self.op))
            except ValueError:
                raise ValueError(f"unknown action op {self.op!r}; expected one of "
                                 f"{', '.join(o.value for o in Op)}") from None

    def __str__(self) -> str:
        return f"{self.op}{self.mb}" + (f".{self.chunk}" if self.chunk else "")

    @classmethod
    def parse(cls, text: str) -> "Action":
        for op in COMM + COMPUTE:
            mb, _, chunk = text[len(op):].partition(".")
            if text.startswith(op) and mb.isdigit() and (chunk.isdigit() or not chunk and "." not in text):
                return cls(Op(op), int(mb), int(chunk or 0))
        raise ValueError(f"cannot parse action {text!r}; expected e.g. F3, B0, I2, W2, SEND_F1, RECV_B4, F3.1 "
                         "(micro-batch 3 of chunk 1)")


def chunks_of(sched: "Schedule") -> int:
    """Model chunks per stage (1 unless the schedule is interleaved)."""
    return 1 + max((a.chunk for acts in sched for a in acts), default=0)


Schedule = list[list[Action]]


def with_comms(sched: Schedule) -> Schedule:
    """Insert point-to-point actions: receive before a compute action that needs a neighbour's output,
    send right after a compute action whose output a neighbour needs."""
    p, v = len(sched), chunks_of(sched)
    last = p * v - 1
    out: Schedule = []
    for s, acts in enumerate(sched):
        lst: list[Action] = []
        for a in acts:
            vs = a.chunk * p + s
            if a.op == Op.F and vs > 0:
                lst.append(Action(Op.RECV_F, a.mb, a.chunk))
            if a.op in (Op.B, Op.I) and vs < last:
                lst.append(Action(Op.RECV_B, a.mb, a.chunk))
            lst.append(a)
            if a.op == Op.F and vs < last:
                lst.append(Action(Op.SEND_F, a.mb, a.chunk))
            if a.op in (Op.B, Op.I) and vs > 0:
                lst.append(Action(Op.SEND_B, a.mb, a.chunk))
        out.append(lst)
    return out


class ScheduleError(ValueError):
    pass


def validate(sched: Schedule, micro_batches: int) -> None:
    """Every stage runs each micro-batch's F once and then either B or I followed by W; the stages together
    cannot deadlock (checked by executing the dependency order with zero durations)."""
    p, v = len(sched), chunks_of(sched)
    for s, acts in enumerate(sched):
        seen: dict[tuple[Op, int, int], int] = {}
        for i, a in enumerate(acts):
            if a.op not in COMPUTE + COMM:
                raise ScheduleError(f"stage {s} action {i}: unknown op {a.op!r}; expected one of {COMPUTE + COMM}")
            if not 0 <= a.mb < micro_batches:
                raise ScheduleError(f"stage {s} action {i} ({a}): micro-batch outside 0..{micro_batches - 1}")
            if (a.op, a.mb, a.chunk) in seen:
                raise ScheduleError(f"stage {s}: {a} appears twice")
            seen[(a.op, a.mb, a.chunk)] = i
        by_chunk: list[dict[tuple[Op, int], int]] = [{} for _ in range(v)]
        for (op, mb, ch), i in seen.items():
            if 0 <= ch < v:
                by_chunk[ch][(op, mb)] = i
        for c, m in ((c, m) for c in range(v) for m in range(micro_batches)):
            _check_micro_batch(s, m, by_chunk[c])
    _check_deadlock([[a for a in acts if a.op in COMPUTE] for acts in sched], p)


def _check_micro_batch(s: int, m: int, seen: dict[tuple[Op, int], int]) -> None:
    """One micro-batch of one chunk on stage s: F once, then B, or I followed by W."""
    if (Op.F, m) not in seen:
        raise ScheduleError(f"stage {s}: micro-batch {m} has no forward F{m}")
    has_b, has_i, has_w = (Op.B, m) in seen, (Op.I, m) in seen, (Op.W, m) in seen
    if has_b == (has_i or has_w) or has_i != has_w:
        raise ScheduleError(f"stage {s}: micro-batch {m} needs either B{m} or both I{m} and W{m}")
    bk = seen[(Op.B, m)] if has_b else seen[(Op.I, m)]
    if bk < seen[(Op.F, m)]:
        raise ScheduleError(f"stage {s}: backward of micro-batch {m} before its forward F{m}")
    if has_w and seen[(Op.W, m)] < seen[(Op.I, m)]:
        raise ScheduleError(f"stage {s}: W{m} before I{m}")


def _check_deadlock(sched: Schedule, p: int) -> None:
    v = chunks_of(sched)
    done: set[tuple[int, Op, int]] = set()
    pos = [0] * p
    progress = True
    while progress:
        progress = False
        for s in range(p):
            while pos[s] < len(sched[s]):
                a = sched[s][pos[s]]
                if not deps_done(a, s, p, done, v):
                    break
                mark_done(a, s, p, done)
                pos[s] += 1
                progress = True
    stuck = [f"stage {s} waits at {sched[s][pos[s]]}" for s in range(p) if pos[s] < len(sched[s])]
    if stuck:
        raise ScheduleError("deadlock: " + "; ".join(stuck))


def mark_done(a: Action, s: int, p: int, done: set[tuple[int, Op, int]]) -> None:
    """Record a finished compute action under its virtual stage ("B" marks B or I, "I" also I)."""
    vs = a.chunk * p + s
    done.add((vs, Op.B if a.op is Op.I else a.op, a.mb))
    if a.op is Op.I:
        done.add((vs, Op.I, a.mb))


def deps_done(a: Action, s: int, p: int, done: set[tuple[int, Op, int]], chunks: int = 1) -> bool:
    """Cross-stage and local dependencies of one compute action, by virtual stage (= s without chunks;
    Op.B in `done` marks B or I finished)."""
    vs, last = a.chunk * p + s, p * chunks - 1
    if a.op is Op.F:
        return vs == 0 or (vs - 1, Op.F, a.mb) in done
    if a.op in (Op.B, Op.I):
        return (vs, Op.F, a.mb) in done and (vs == last or (vs + 1, Op.B, a.mb) in done)
    return (vs, Op.I, a.mb) in done  # W
