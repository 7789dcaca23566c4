"""Pipeline schedules as per-stage lists of actions, the representation shared by the engine and the simulator.

Compute actions: F (forward), B (full backward), I (input-gradient backward), W (weight-gradient backward).
Communication actions: SEND_F/RECV_F (activations to/from the next/previous stage) and SEND_B/RECV_B
(gradients). A schedule is `list[list[Action]]`, one list per stage in execution order.
"""
from __future__ import annotations

from dataclasses import dataclass

COMPUTE = ("F", "B", "I", "W")
COMM = ("SEND_F", "RECV_F", "SEND_B", "RECV_B")


@dataclass(frozen=True)
class Action:
    op: str
    mb: int

    def __str__(self) -> str:
        return f"{self.op}{self.mb}"

    @classmethod
    def parse(cls, text: str) -> "Action":
        for op in COMM + COMPUTE:
            if text.startswith(op) and text[len(op):].isdigit():
                return cls(op, int(text[len(op):]))
        raise ValueError(f"cannot parse action {text!r}; expected e.g. F3, B0, I2, W2, SEND_F1, RECV_B4")


Schedule = list[list[Action]]


def with_comms(sched: Schedule) -> Schedule:
    """Insert point-to-point actions: receive before a compute action that needs a neighbour's output,
    send right after a compute action whose output a neighbour needs."""
    p = len(sched)
    out: Schedule = []
    for s, acts in enumerate(sched):
        lst: list[Action] = []
        for a in acts:
            if a.op == "F" and s > 0:
                lst.append(Action("RECV_F", a.mb))
            if a.op in ("B", "I") and s < p - 1:
                lst.append(Action("RECV_B", a.mb))
            lst.append(a)
            if a.op == "F" and s < p - 1:
                lst.append(Action("SEND_F", a.mb))
            if a.op in ("B", "I") and s > 0:
                lst.append(Action("SEND_B", a.mb))
        out.append(lst)
    return out


class ScheduleError(ValueError):
    pass


def validate(sched: Schedule, micro_batches: int) -> None:
    """Every stage runs each micro-batch's F once and then either B or I followed by W; the stages together
    cannot deadlock (checked by executing the dependency order with zero durations)."""
    p = len(sched)
    for s, acts in enumerate(sched):
        seen: dict[tuple[str, int], int] = {}
        for i, a in enumerate(acts):
            if a.op not in COMPUTE + COMM:
                raise ScheduleError(f"stage {s} action {i}: unknown op {a.op!r}; expected one of {COMPUTE + COMM}")
            if not 0 <= a.mb < micro_batches:
                raise ScheduleError(f"stage {s} action {i} ({a}): micro-batch outside 0..{micro_batches - 1}")
            if (a.op, a.mb) in seen:
                raise ScheduleError(f"stage {s}: {a} appears twice")
            seen[(a.op, a.mb)] = i
        for m in range(micro_batches):
            if ("F", m) not in seen:
                raise ScheduleError(f"stage {s}: micro-batch {m} has no forward F{m}")
            has_b, has_i, has_w = ("B", m) in seen, ("I", m) in seen, ("W", m) in seen
            if has_b == (has_i or has_w) or has_i != has_w:
                raise ScheduleError(f"stage {s}: micro-batch {m} needs either B{m} or both I{m} and W{m}")
            bk = seen.get(("B", m), seen.get(("I", m)))
            if bk < seen[("F", m)]:
                raise ScheduleError(f"stage {s}: backward of micro-batch {m} before its forward F{m}")
            if has_w and seen[("W", m)] < seen[("I", m)]:
                raise ScheduleError(f"stage {s}: W{m} before I{m}")
    _check_deadlock([[a for a in acts if a.op in COMPUTE] for acts in sched], p)


def _check_deadlock(sched: Schedule, p: int) -> None:
    done: set[tuple[int, str, int]] = set()
    pos = [0] * p
    progress = True
    while progress:
        progress = False
        for s in range(p):
            while pos[s] < len(sched[s]):
                a = sched[s][pos[s]]
                if not deps_done(a, s, p, done):
                    break
                done.add((s, "B" if a.op == "I" else a.op, a.mb))
                if a.op == "I":
                    done.add((s, "I", a.mb))
                pos[s] += 1
                progress = True
    stuck = [f"stage {s} waits at {sched[s][pos[s]]}" for s in range(p) if pos[s] < len(sched[s])]
    if stuck:
        raise ScheduleError("deadlock: " + "; ".join(stuck))


def deps_done(a: Action, s: int, p: int, done: set[tuple[int, str, int]]) -> bool:
    """Cross-stage and local dependencies of one compute action ("B" in `done` marks B or I finished)."""
    if a.op == "F":
        return s == 0 or (s - 1, "F", a.mb) in done
    if a.op in ("B", "I"):
        return (s, "F", a.mb) in done and (s == p - 1 or (s + 1, "B", a.mb) in done)
    return (s, "I", a.mb) in done  # W
