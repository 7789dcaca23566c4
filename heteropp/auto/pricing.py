"""A candidate plan's simulated time with its schedule's best parameters (`best_params`: each option
simulated, the fastest kept), and the local search over its layer split and H-1F1B's warm-up (`refine`).
The ranking step (ranking.py) prices its pool with these; `planning.to_plan` writes the chosen option."""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Callable, Iterator

from ..schedules import kind
from ..spec import InfeasibleError
from .candidates import Candidate
from .costs import StageSpec, micro_batches, virtual_stages
from .problem import Problem

# options best_params simulates, as charged to the ranking budget: len(WARMUP_SCALES) or MAX_CHUNKS (H-1F1B
# also simulates HARP's launch rule and the candidate's own warm-up where they differ from those)
WARMUP_OR_CHUNK_OPTIONS = 5



def _moves(pb: Problem, cand: Candidate, params: dict[str, Any]) -> Iterator[Candidate]:
    """`cand` one layer away, each fitting in memory: one layer moved from one stage to another (every stage
    keeps a layer; the stage that gains it recomputes where it then fits only so, the one that loses it
    stops recomputing where it then fits without). Each carries `params`, the best found so far, as an
    option to try. Listed nearest first (across one boundary, two, ...), generated as they are tried: the
    budget may stop a step part-way."""
    for gap in range(1, len(cand.stages)):
        yield from _layer_moves(pb, cand, params, gap)


def _warmup_steps(pb: Problem, cand: Candidate, extra: list[int] | None, moved: bool) -> Iterator[list[int]]:
    """H-1F1B's extra warm-up of one boundary one more or one less than `extra`, or with `moved` one step
    moved from one boundary to another (where memory holds no more in flight, a step up alone is cut back
    to `extra` itself), each cut back to fit; none for a schedule without it. Generated as tried."""
    n = len(extra or [])
    singles = ({j: s} for j in range(n) for s in (1, -1))
    shifts = ({i: 1, j: -1} for j in range(n) for i in range(n) if i != j)
    seen = [extra]
    for delta in shifts if moved else singles:
        trial = list(extra or [])
        for j, s in delta.items():
            trial[j] += s
        if min(trial, default=0) >= 0:
            trial = warmup_within_memory(pb, cand, trial)[0]["extra_warmup"]
            if trial not in seen:
                seen.append(trial)
                yield trial


def _layer_moves(pb: Problem, cand: Candidate, params: dict[str, Any], gap: int) -> Iterator[Candidate]:
    """_moves' layer moves between stages `gap` apart, either way."""
    cm, dp = pb.cm, cand.dp
    b = micro_batches(pb.train, dp)
    for j in range(len(cand.stages) - gap):
        for src, dst in ((j, j + gap), (j + gap, j)):
            if cand.stages[src].layers <= 1:
                continue
            st = list(cand.stages)
            st[src] = replace(st[src], layers=st[src].layers - 1)
            st[dst] = replace(st[dst], layers=st[dst].layers + 1)
            if st[src].recompute:  # a stage's memory depends on its own flag alone
                off = cm.evaluate([*st[:src], replace(st[src], recompute=False), *st[src + 1:]], dp, b)
                if off.stage_memory_bytes[src] <= off.stage_capacity_bytes[src]:
                    st[src] = replace(st[src], recompute=False)
            est = cm.evaluate(st, dp, b)
            if not est.feasible and not st[dst].recompute:
                st[dst] = replace(st[dst], recompute=True)
                est = cm.evaluate(st, dp, b)
            if est.feasible:
                yield Candidate(est.iteration_time_s, dp, st, cand.label, params)


def refine(pb: Problem, cand: Candidate, budget: int,
           floor: Callable[[Candidate], float] | None = None) -> tuple[float, Candidate, int]:
    """Hill-climb from `cand` by single steps, while a step makes it faster and `budget` (simulated actions)
    lasts: H-1F1B's extra warm-up of one boundary one more or one less, or where none is faster one step of
    it moved to another boundary (_warmup_steps), each timed alone; where none is faster, one layer moved
    (_moves), each timed with its best parameters (best_params); the fastest step of a round is taken. The
    search's layer split is the best under its parameter-free objective, not under the schedule's
    parameters, and H-1F1B's options set every boundary by one rule. `floor`: a lower bound of a step's
    simulated time (ranking.floor); a layer move whose bound cannot beat the round's best is not simulated.
    Returns the time, the candidate (carrying its parameters) and the budget left."""
    from .plan_sim import iteration_time
    params, _, time_s = best_params(pb, cand)
    cand = replace(cand, params=params)
    b = micro_batches(pb.train, cand.dp)
    while True:
        best: tuple[float, Candidate] | None = None
        # H-1F1B's warm-up steps first, single ones before moved ones: they keep the stages, whose other
        # options are timed already, so each simulates its own warm-up alone (a layer move, every option)
        for trial in (t for moved in (False, True) if best is None
                      for t in _warmup_steps(pb, cand, params.get("extra_warmup"), moved)):
            budget -= len(cand.stages) * b
            if budget < 0:
                return time_s, cand, 0
            t = iteration_time(pb.cm, cand.stages, cand.dp, pb.train.schedule, {"extra_warmup": trial})
            if t < time_s * (1 - 1e-9) and (best is None or t < best[0]):
                best = (t, replace(cand, params={"extra_warmup": trial}))
        if best is None:
            for nb in _moves(pb, cand, params):
                if floor is not None and floor(nb) >= (time_s if best is None else best[0]) * (1 - 1e-9):
                    continue  # cannot be the round's fastest step
                budget -= len(nb.stages) * b * (WARMUP_OR_CHUNK_OPTIONS + 1)
                if budget < 0:
                    return time_s, cand, 0
                try:
                    q, _, t = best_params(pb, nb)
                except InfeasibleError:
                    continue
                if t < time_s * (1 - 1e-9) and (best is None or t < best[0]):
                    best = (t, replace(nb, params=q))
        if best is None:
            return time_s, cand, budget
        time_s, cand = best
        params = cand.params or {}



WARMUP_SCALES = (0.0, 0.5, 1.0, 1.5, 2.0)  # H-1F1B options: HARP's extra warm-up per boundary times these
MAX_CHUNKS = 4  # interleaved 1F1B options: 1 .. this many model chunks per stage


def choose_params(pb: Problem, cand: Candidate) -> tuple[dict[str, Any], list[StageSpec]]:
    """best_params without the simulated time."""
    params, stages, _ = best_params(pb, cand)
    return params, stages


def best_params(pb: Problem, cand: Candidate) -> tuple[dict[str, Any], list[StageSpec], float]:
    """The parameters of the plan's schedule and the stages the plan lists (virtual stages when it
    interleaves), the option (param_options) the simulator finds fastest. Ties go to the smaller option.
    Also returns its simulated time."""
    from .plan_sim import iteration_time
    options, sched = param_options(pb, cand), pb.train.schedule
    if not options:
        return {}, cand.stages, iteration_time(pb.cm, cand.stages, cand.dp, sched)
    times = [iteration_time(pb.cm, st, cand.dp, sched, q) for q, st in options]  # the simulator's recurrence
    i = min(range(len(options)), key=lambda i: (times[i], i))
    return options[i][0], options[i][1], times[i]



def param_options(pb: Problem, cand: Candidate) -> list[tuple[dict[str, Any], list[StageSpec]]]:
    """The parameter options of the plan's schedule that fit in memory, with the stages the simulator runs
    for each (empty for a schedule without parameters): H-1F1B's extra warm-up as HARP's paper rule scaled
    by WARMUP_SCALES (0: plain 1F1B), as HARP's code launches it (launch_warmup: none on fast boundaries),
    and the candidate's own, each cut back to fit (warmup_within_memory); interleaved 1F1B's chunks
    from 1 to MAX_CHUNKS, where every stage holds a layer per chunk and the micro-batches come in groups of
    the stages, each with the stages recomputing that need it to hold its in-flight count (recompute_to_fit;
    one chunk too holds more than 1F1B) and dropped where one does not fit even so."""
    from .plan_sim import launch_warmup, schedule_params
    sk, cm, dp = kind(pb.train.schedule), pb.cm, cand.dp
    b, p = micro_batches(pb.train, dp), len(cand.stages)
    options: list[tuple[dict[str, Any], list[StageSpec]]] = []
    if "extra_warmup" in sk.params:
        rule = schedule_params(cm, cand.stages, dp, pb.train.schedule)["extra_warmup"]
        seen: list[list[int]] = []
        tries = [[math.floor(x * f + 0.5) for x in rule] for f in WARMUP_SCALES]
        tries.append(launch_warmup(cm, cand.stages, dp))
        if cand.params and len(cand.params.get("extra_warmup") or []) == p - 1:
            tries.append(list(cand.params["extra_warmup"]))
        for t in tries:
            extra = warmup_within_memory(pb, cand, t)[0]["extra_warmup"]
            if extra not in seen:
                seen.append(extra)
                options.append(({"extra_warmup": extra}, cand.stages))
    elif "chunks" in sk.params:
        if b % p:
            raise InfeasibleError(f"interleaved 1F1B runs micro-batches in groups of the {p} stages of the best "
                                  f"plan, and {b} micro-batches per replica is not a multiple of {p}; choose a "
                                  "global batch that is, or another schedule")
        for v in range(1, MAX_CHUNKS + 1):
            if any(s.layers < v for s in cand.stages):
                break
            fitted = recompute_to_fit(pb, cand, {"chunks": v})
            if fitted is not None:
                options.append(({"chunks": v}, virtual_stages(fitted, v)))
        if not options:
            raise InfeasibleError(f"interleaved 1F1B holds more micro-batches in flight than 1F1B, and no count "
                                  f"of chunks from 1 to {MAX_CHUNKS} fits the plan's stages in memory, even "
                                  "recomputing; choose 1F1B or H-1F1B, or a smaller micro-batch")
    return options


def recompute_to_fit(pb: Problem, cand: Candidate, params: dict[str, Any]) -> list[StageSpec] | None:
    """The plan's stages with recompute turned on where a stage does not fit its in-flight activations under
    `params` otherwise (interleaved 1F1B holds more than the 1F1B the search checked; a stage's memory
    depends on its own flag alone), or None where one does not fit even so."""
    cm, dp = pb.cm, cand.dp
    b = micro_batches(pb.train, dp)
    caps = [cm.cluster.chip(s.chip).usable_bytes for s in cand.stages]
    stages = list(cand.stages)
    for _ in range(2):
        mem = cm.evaluate(stages, dp, b, pb.train.schedule, params=params).stage_memory_bytes
        over = [k for k, (m, c) in enumerate(zip(mem, caps)) if m > c]
        if not over:
            return stages
        if all(stages[k].recompute for k in over):
            return None
        stages = [replace(s, recompute=True) if k in over else s for k, s in enumerate(stages)]
    return None


def warmup_within_memory(pb: Problem, cand: Candidate,
                         extra: list[int] | None = None) -> tuple[dict[str, Any], list[float]]:
    """H-1F1B's parameters for the searched plan (`extra`, by default HARP's extra warm-up per boundary
    from the costs), each boundary's extra cut back, largest first, until every stage holds its in-flight
    activations within its usable memory; and the stages' memory then."""
    from .plan_sim import schedule_params
    cm, p = pb.cm, len(cand.stages)
    b = micro_batches(pb.train, cand.dp)
    if extra is None:
        extra = schedule_params(cm, cand.stages, cand.dp, pb.train.schedule)["extra_warmup"]
    extra = list(extra)

    def memory() -> list[float]:  # the cost model's, inner replicas' shares and shards included
        return cm.evaluate(
            cand.stages, cand.dp, b, pb.train.schedule, params={"extra_warmup": extra}
        ).stage_memory_bytes

    mem = memory()
    while any(m > cm.cluster.chip(s.chip).usable_bytes for m, s in zip(mem, cand.stages)):
        k = next(k for k, (m, s) in enumerate(zip(mem, cand.stages)) if m > cm.cluster.chip(s.chip).usable_bytes)
        later = [j for j in range(k, p - 1) if extra[j] > 0]  # the boundaries whose warm-up stage k holds
        if not later:
            break  # 1F1B's own in-flight count: the search made it fit
        j = max(later, key=lambda j: extra[j])
        extra[j] -= 1
        mem = memory()
    return {"extra_warmup": extra}, mem
