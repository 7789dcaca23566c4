"""GPipe, 1F1B, H-1F1B and ZB-H1 as per-stage compute-action lists (registry.py names them)."""
from __future__ import annotations

from .actions import Action, Op, Schedule, ScheduleError


def gpipe(p: int, m: int) -> Schedule:
    return [[Action(Op.F, i) for i in range(m)] + [Action(Op.B, i) for i in range(m)] for _ in range(p)]


def h_1f1b(p: int, m: int, extra_warmup: list[int]) -> Schedule:
    """1F1B with extra_warmup[j] more warm-up forwards in front of boundary j (all zeros: plain 1F1B): stage
    s runs min(sum_{j>=s} (1 + extra_warmup[j]), m) warm-up forwards, then alternates F and B, then drains
    the backwards. Warm-ups fall by at least one per stage, so no stage waits on a backward that needs a
    forward it has not sent."""
    out: Schedule = []
    for s in range(p):
        warm = min(sum(1 + x for x in extra_warmup[s:]), m)
        acts = [Action(Op.F, i) for i in range(warm)]
        f, b = warm, 0
        while f < m:
            acts += [Action(Op.F, f), Action(Op.B, b)]
            f, b = f + 1, b + 1
        acts += [Action(Op.B, i) for i in range(b, m)]
        out.append(acts)
    return out


def one_f_one_b(p: int, m: int) -> Schedule:
    """Stage s runs min(p-1-s, m) warm-up forwards, then alternates F and B, then drains the backwards."""
    return h_1f1b(p, m, [0] * max(p - 1, 0))


def zb_h1(p: int, m: int) -> Schedule:
    """1F1B with B split into I and W. Stage s holds back s weight passes (the last stage the most, since it
    waits longest in the cool-down) and runs them in the drain, filling the 1F1B bubble."""
    out: Schedule = []
    for s in range(p):
        warm = min(p - 1 - s, m)
        acts = [Action(Op.F, i) for i in range(warm)]
        pending: list[int] = []
        f, b = warm, 0
        hold = min(s, m)
        while f < m:
            acts += [Action(Op.F, f), Action(Op.I, b)]
            pending.append(b)
            if len(pending) > hold:
                acts.append(Action(Op.W, pending.pop(0)))
            f, b = f + 1, b + 1
        for i in range(b, m):
            acts.append(Action(Op.I, i))
            pending.append(i)
            if len(pending) > hold:
                acts.append(Action(Op.W, pending.pop(0)))
        acts += [Action(Op.W, i) for i in pending]
        out.append(acts)
    return out


def interleaved_1f1b(p: int, m: int, chunks: int) -> Schedule:
    """Megatron's interleaved 1F1B: stage s holds `chunks` model chunks (virtual stages c * p + s). Forward
    micro-step i runs chunk (i // p) % v of micro-batch (i // (p v)) p + i % p, backward micro-step i the same
    micro-batch's chunk v - 1 - (i // p) % v; stage s warms up with (p - s - 1) * 2 + (v - 1) * p forward
    micro-steps, then alternates, then drains. Needs m to be a multiple of p."""
    v, total = chunks, m * chunks
    if m % p:
        raise ScheduleError(f"interleaved 1F1B runs micro-batches in groups of the {p} stages: {m} micro-batches "
                            f"is not a multiple of {p}")

    def step(i: int, backward: bool) -> tuple[int, int]:
        c = (i // p) % v
        return (i // (p * v)) * p + i % p, (v - 1 - c if backward else c)

    out: Schedule = []
    for s in range(p):
        warm = min((p - s - 1) * 2 + (v - 1) * p, total)
        acts = [Action(Op.F, *step(i, False)) for i in range(warm)]
        for i in range(total - warm):
            acts += [Action(Op.F, *step(warm + i, False)), Action(Op.B, *step(i, True))]
        acts += [Action(Op.B, *step(i, True)) for i in range(total - warm, total)]
        out.append(acts)
    return out

