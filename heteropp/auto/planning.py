"""Load inputs, run a search, and turn its result into the shared Plan schema."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Iterator

from ..plan import Plan, StagePlan
from ..spec import Cluster, InfeasibleError, ModelSpec, TrainSpec, load_cluster, load_model, load_train
from ..schedules import kind
from .analytic import analytic_profile
from .costs import CostModel, StageSpec, micro_batches, virtual_stages
from .limits import DEFAULT_LIMITS, Limits
from .profiles import Profile
from .plan_sim import compute_floor
from .candidates import Candidate, NothingFaster, Progress, SearchResult
from .extended import extended_candidates
from .search import longest_plan_actions, reported, search_auto


@dataclass
class Problem:
    cluster: Cluster
    model: ModelSpec
    train: TrainSpec
    cm: CostModel


def load_problem(cluster: str, model: str, train: str, profile: str | None = None) -> Problem:
    cl, m = load_cluster(cluster), load_model(model)
    tr = load_train(train, m.seq_len)
    return make_problem(cl, m, tr, Profile.load(profile) if profile else None)


def make_problem(cl: Cluster, m: ModelSpec, tr: TrainSpec, prof: Profile | None = None) -> Problem:
    """The problem of loaded specs (a profile, or the analytic one)."""
    prof = prof or analytic_profile(cl, m, tr)
    searched = kind(tr.schedule).searched_as or tr.schedule  # H-1F1B: planned as 1F1B, then warmed up
    return Problem(cl, m, tr, CostModel(cl, m, replace(tr, schedule=searched), prof))


def run_search(pb: Problem, algo: str = "auto", group_size: int = 128, progress: Progress | None = None,
               limits: Limits = DEFAULT_LIMITS, idle: str = "auto", baselines: bool = True,
               rounded: bool = True, beat_s: float = math.inf, extended: bool = True) -> SearchResult:
    """The plans of `algo`; `auto`'s best is then never slower, by simulation, than any of the baselines
    (baselines.py: h2, subsets of the chip types, rounded counts, a FLOPs-proportional split) unless
    `baselines` is off (the baselines' own sub-searches). `beat_s` (auto, a schedule without parameters):
    only plans that may run faster are searched, and NothingFaster is raised where none does. `extended`:
    on a small instance also the larger space's plans (extended.py: idle chips anywhere, any dp, types
    interleaved); off for the baselines' sub-clusters, whose plans that space already holds."""
    if math.isfinite(beat_s) and (algo != "auto" or kind(pb.train.schedule).params):
        raise ValueError(f"run_search: beat_s with algo {algo!r} and schedule {pb.train.schedule}; expected auto "
                         "and a schedule without parameters")
    try:
        res: SearchResult | None = _run_search(pb, algo, group_size, progress, limits, idle, beat_s, extended)
    except NothingFaster:
        if not baselines:
            raise
        res = None
    if algo == "auto" and baselines:
        return never_worse(pb, res, group_size, limits, idle, progress, rounded, beat_s)
    assert res is not None
    return res


def never_worse(pb: Problem, res: SearchResult | None, group_size: int, limits: Limits, idle: str,
                progress: Progress | None = None, rounded: bool = True, beat_s: float = math.inf) -> SearchResult:
    """`res` with its best plan replaced by the fastest baseline (baselines.candidates) where one
    simulates faster, with each one's best schedule parameters (best_params, as to_plan times the plan);
    the search's plan then leads the runners-up. Work skipped: a baseline whose compute alone
    (plan_sim.compute_floor, a lower bound of its simulated time) cannot beat the fastest plan so far is not
    simulated; a sub-cluster's search is told that time
    (search_auto's beat_s) and searches only plans that may beat it. `res` None: the search found no plan
    faster than `beat_s`; NothingFaster where no baseline is either."""
    from . import baselines as bl
    t = math.inf
    if res is not None:
        try:
            t = best_params(pb, res.best)[2]
        except InfeasibleError:
            pass
    best: Candidate | None = None
    fastest = [min(t, beat_s)]  # read by the baselines to skip sub-clusters whose bound cannot beat it
    cutoff = not kind(pb.train.schedule).params  # sub-searches told the time to beat (search_auto's beat_s)
    interleaves = "chunks" in kind(pb.train.schedule).params  # simulated on virtual stages: no floor taken

    def plan(sub: Problem, lim: Limits, with_baselines: bool) -> SearchResult:
        return run_search(sub, "auto", group_size, limits=lim, idle=idle, baselines=with_baselines, rounded=False,
                          beat_s=fastest[0] if cutoff else math.inf, extended=False)

    def sub_problem(cl: Cluster) -> Problem:
        return Problem(cl, pb.model, pb.train, CostModel(cl, pb.model, pb.cm.train, pb.cm.profile))

    for cand in bl.candidates(pb, group_size, limits, idle, plan, sub_problem, lambda: fastest[0], rounded):
        if not interleaves and compute_floor(pb.cm, cand.stages, cand.dp) >= fastest[0]:
            continue  # cannot be faster: not simulated
        try:
            q, _, tc = best_params(pb, cand)
        except InfeasibleError:
            continue
        if tc < fastest[0] * (1 - 1e-9):
            best, fastest[0] = replace(cand, time_s=tc, params=q or None), tc
    if best is None:
        if res is None:
            raise NothingFaster(f"no plan runs faster than {beat_s:.6g} s")
        return res
    if progress:
        progress(f"a baseline simulates faster than the search's plan: {best.label} at {fastest[0]:.4f} s")
    if res is None:
        return SearchResult(best, [])
    return replace(res, best=best, runners_up=[res.best, *res.runners_up][:RERANK_FIRST - 1])


def _run_search(pb: Problem, algo: str, group_size: int, progress: Progress | None, limits: Limits,
                idle: str, beat_s: float = math.inf, extended: bool = True) -> SearchResult:
    if algo == "h2":
        from .h2 import search_h2
        res = search_h2(pb.cm, group_size, progress=progress)
        # the paper's objective priced the plan; it carries the full estimate, as search_auto's plans do, or
        # under a schedule with parameters its simulated time with the parameters the plan file gets
        if kind(pb.train.schedule).params:
            return with_params_timed(pb, res)
        return replace(res, best=reported(pb.cm, [res.best])[0], objective_s=res.best.time_s)
    if algo != "auto":
        raise ValueError(f"unknown algorithm {algo!r}; expected auto or h2")
    if not kind(pb.train.schedule).params and not small_enough_to_simulate(pb):
        return search_auto(pb.cm, group_size, progress=progress, limits=limits, idle=idle, beat_s=beat_s)
    more = extended_candidates(pb.cm) if extended and idle != "never" else []
    try:
        res = search_auto(pb.cm, group_size, RERANK_POOL, progress=progress, limits=limits, idle=idle,
                          margin=POOL_MARGIN, beat_s=beat_s)
    except InfeasibleError:  # NothingFaster included: the larger space may still hold a plan
        if not more:
            raise
        res = SearchResult(more[0], more[1:])
    else:  # after the search's own plans, so its best and next three are always re-ranked
        res = replace(res, runners_up=[*res.runners_up, *more])
    return rank_with_params(pb, res)


def small_enough_to_simulate(pb: Problem) -> bool:
    """Whether every plan the search can collect for the re-rank (RERANK_POOL of them, each with as many
    stages as layers or chips allow) is simulated within RERANK_ACTIONS, at every dp. A schedule without
    parameters is then re-ranked as one with parameters is (rank_with_params): the search prunes and
    splits by its objective, which overprices short pipelines at few micro-batches (up to ~27%), so the
    plan it finds best can be slower than one it ranked lower, or than another split of its stages."""
    from .space import dp_candidates
    try:
        dps = dp_candidates(pb.cluster, pb.train)
    except InfeasibleError:
        return False  # only idle-chip plans: the search says so, or finds them
    return longest_plan_actions(pb.cm, dps) * RERANK_POOL <= RERANK_ACTIONS


RERANK_FIRST = 4  # the best plan and the next three are always re-ranked with their parameters
RERANK_POOL = 24  # plans the search collects for the re-rank at most
# the margin of the search's objective within which it collects them: the objective prices neither round
# trips nor warm-up, which parameters change by more than the estimate's error
POOL_MARGIN = 0.25
RERANK_ACTIONS = 100_000  # beyond the first four: stage x micro-batch actions simulated, over every option
# options best_params simulates, as charged to the budget: len(WARMUP_SCALES) or MAX_CHUNKS (H-1F1B also
# simulates HARP's launch rule and the candidate's own warm-up where they differ from those)
WARMUP_OR_CHUNK_OPTIONS = 5


def rank_with_params(pb: Problem, res: SearchResult) -> SearchResult:
    """The search ranks plans under the parameter-free schedule it searches as (searched_as), by its
    objective; this re-ranks them by their simulated time with each one's own best parameters
    (best_params), so that H-1F1B's warm-up or interleaved chunks can change which plan wins, and so that
    a plan the objective overprices (round trips, few micro-batches) still wins where it runs faster (a
    schedule without parameters comes here where small_enough_to_simulate). Re-ranked are the best plan,
    the next three, and every further plan the search collected, in increasing least estimate with
    parameters (least_estimate) while RERANK_ACTIONS last: a plan whose estimate is well above the best
    one's can still be a step from a faster one. Then each, fastest first, gets a local search over its
    layer split and warm-up (refine) while another RERANK_ACTIONS last. A candidate the schedule cannot
    run (interleaved: micro-batches not in groups of its stages) drops out, unless none can run (to_plan
    then says why)."""
    pool, rest = [res.best, *res.runners_up[:RERANK_FIRST - 1]], res.runners_up[RERANK_FIRST - 1:]
    if rest:
        least = {id(c): least_estimate(pb, c) for c in rest}
        spent = 0
        for cand in sorted((c for c in rest if math.isfinite(least[id(c)])), key=lambda c: least[id(c)]):
            spent += len(cand.stages) * micro_batches(pb.train, cand.dp) * WARMUP_OR_CHUNK_OPTIONS
            if spent > RERANK_ACTIONS:
                break
            pool.append(cand)
    timed: list[tuple[float, int, Candidate]] = []
    for i, cand in enumerate(pool):
        try:
            timed.append((best_params(pb, cand)[2], i, cand))
        except InfeasibleError:
            continue
    if not timed:
        return res
    timed.sort(key=lambda x: x[:2])
    budget = RERANK_ACTIONS
    for t, i, cand in list(timed):  # fastest first, while the budget lasts
        if budget <= 0:
            break
        t2, better, budget = refine(pb, cand, budget)
        if t2 < t:
            timed.append((t2, i, better))
    # each carries its simulated time with its best parameters (the search's was its objective under searched_as)
    ranked = [replace(c, time_s=t) for t, _, c in sorted(timed, key=lambda x: x[:2])]
    return replace(res, best=ranked[0], runners_up=ranked[1:RERANK_FIRST])


def with_params_timed(pb: Problem, res: SearchResult) -> SearchResult:
    """`res`'s plans in its own order, each carrying its parameters and its simulated time with them
    (best_params, as to_plan writes them); a runner-up the schedule cannot run drops out."""
    timed = []
    for i, cand in enumerate([res.best, *res.runners_up]):
        try:
            params, _, t = best_params(pb, cand)
        except InfeasibleError:
            if i == 0:
                raise
            continue
        timed.append(replace(cand, time_s=t, params=params or None))
    return replace(res, best=timed[0], runners_up=timed[1:], objective_s=res.best.time_s)


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


def refine(pb: Problem, cand: Candidate, budget: int) -> tuple[float, Candidate, int]:
    """Hill-climb from `cand` by single steps, while a step makes it faster and `budget` (simulated actions)
    lasts: H-1F1B's extra warm-up of one boundary one more or one less, or where none is faster one step of
    it moved to another boundary (_warmup_steps), each timed alone; where none is faster, one layer moved
    (_moves), each timed with its best parameters (best_params); the fastest step of a round is taken. The
    search's layer split is the best under its parameter-free objective, not under the schedule's
    parameters, and H-1F1B's options set every boundary by one rule. Returns the time, the candidate
    (carrying its parameters) and the budget left."""
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


def to_plan(pb: Problem, cand: Candidate, search_time_s: float | None, algo: str,
            result: SearchResult | None = None) -> Plan:
    """The plan of `cand`; with the search's `result`, extra["search"] says whether it was exact or which
    limits bounded it, and the lower bound on every plan then. A schedule that takes parameters gets them
    chosen here, by simulating each option (choose_params)."""
    from .plan_sim import simulate_stages
    b = micro_batches(pb.train, cand.dp)
    params, written = choose_params(pb, cand)
    # the stages as the option runs them (recomputing where interleaving's in-flight count needs it)
    grouped = [replace(s, recompute=w.recompute) for s, w in zip(cand.stages, written)]
    est = pb.cm.evaluate(grouped, cand.dp, b, pb.train.schedule, round_trips=True, params=params)
    # the plan states the simulator's time; the cost model's, with 1F1B's round trips priced (the search
    # ranks without them), stays in extra["model_estimate_s"]
    sim = simulate_stages(pb.cm, written, cand.dp, pb.train.schedule, params=params).iteration_time_s
    p = len(cand.stages)
    # a virtual stage (interleaved) reports its share of its group's time and the group's memory
    stages = [StagePlan(chip=s.chip, tp=s.tp, layers=s.layers, recompute=s.recompute, inner_dp=s.inner_dp,
                        est_time_s=round(est.stage_time_s[i % p] * s.layers / cand.stages[i % p].layers, 6),
                        est_memory_gb=round(est.stage_memory_bytes[i % p] / 1e9, 3))
              for i, s in enumerate(written)]
    return Plan(stages=stages, dp=cand.dp, micro_batch_size=pb.train.micro_batch_size, micro_batches=b,
                schedule=pb.train.schedule, schedule_params=params, model=pb.model.name, num_layers=pb.model.layers,
                iteration_time_s=sim, search_time_s=search_time_s, algo=algo,
                extra={"model_estimate_s": est.iteration_time_s, "bottleneck": est.bottleneck,
                       "fill_drain_s": est.fill_drain_s,
                       "boundary_s": est.boundary_s,
                       "in_flight": [kind(pb.train.schedule).in_flight(k, p, b, params) for k in range(p)],
                       "memory_capacity_gb": [c / 1e9 for c in est.stage_capacity_bytes],
                       "tokens_per_chip_s": pb.train.global_batch * pb.model.seq_len
                       / (sim * pb.cluster.total_chips),
                       **({"search": {"exact": not result.bounded, "bounded_by": result.bounded,
                                      "lower_bound_s": result.lower_bound_s}} if result else {})})


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


def least_estimate(pb: Problem, cand: Candidate) -> float:
    """The cost model's least estimate over the options best_params simulates (the plan's own schedule);
    inf where the schedule cannot run the plan."""
    b, sched = micro_batches(pb.train, cand.dp), pb.train.schedule
    try:
        options = param_options(pb, cand) or [({}, cand.stages)]
    except InfeasibleError:
        return math.inf
    return min(pb.cm.evaluate([replace(s, recompute=w.recompute) for s, w in zip(cand.stages, st)], cand.dp, b,
                              sched, round_trips=True, params=q).iteration_time_s for q, st in options)


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
