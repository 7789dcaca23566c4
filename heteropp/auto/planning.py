"""Load inputs, run a search, and turn its result into the shared Plan schema."""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Iterable, Sequence

from ..plan import Plan, StagePlan
from ..spec import Cluster, InfeasibleError, ModelSpec, TrainSpec, load_cluster, load_model, load_train
from ..schedules import kind
from .analytic import analytic_profile
from .costs import CostModel, micro_batches, virtual_stages as virtual_stages
from .limits import DEFAULT_LIMITS, Limits
from .profiles import Profile, check_fits, merged
from .candidates import Candidate, NothingFaster, Progress, SearchResult
from .extended import extended_candidates
from .pricing import WARMUP_OR_CHUNK_OPTIONS as WARMUP_OR_CHUNK_OPTIONS, best_params as best_params
from .pricing import choose_params, refine as refine, warmup_within_memory as warmup_within_memory
from .problem import Problem as Problem
from .ranking import RANK_ACTIONS, SUB_SHARE, Ranking, sig
from .search import longest_plan_actions, search_auto


def load_problem(cluster: str, model: str, train: str, profile: str | Sequence[str] | None = None,
                 seq_len: int | None = None) -> Problem:
    """The problem of spec files. `profile`: a measured profile's file, or several, each holding other chip types
    (merged; default: the analytic profile); `seq_len`: the training sequence length (default: the model's; for
    a HuggingFace config its max_position_embeddings), as `heteropp run --seq-len` trains."""
    cl, m = load_cluster(cluster), load_model(model, seq_len)
    tr = load_train(train, m.seq_len)
    paths = [profile] if isinstance(profile, str) else list(profile or [])
    if not paths:
        return make_problem(cl, m, tr)
    return make_problem(cl, m, tr, merged([(path, Profile.load(path)) for path in paths]),
                        profile_source=", ".join(paths))


def make_problem(cl: Cluster, m: ModelSpec, tr: TrainSpec, prof: Profile | None = None,
                 holders_elsewhere: int = 0, elsewhere: tuple[float, float | None] | None = None,
                 profile_source: str | None = None) -> Problem:
    """The problem of loaded specs (a profile, or the analytic one); `holders_elsewhere` and `elsewhere` as
    CostModel's. A profile read from files (`profile_source`: their names) or measured (`heteroauto profile`)
    must fit the problem (profiles.check_fits); one set by hand only needs its chip types and TP sizes."""
    if prof is not None:
        check_fits(prof, profile_source or f"<profile of {prof.model}>", cl, m, tr,
                   measured_on=profile_source is not None or prof.source == "measured")
    prof = prof or analytic_profile(cl, m, tr)
    searched = kind(tr.schedule).searched_as or tr.schedule  # H-1F1B: planned as 1F1B, then warmed up
    return Problem(cl, m, tr, CostModel(cl, m, replace(tr, schedule=searched), prof, holders_elsewhere, elsewhere))


def run_search(pb: Problem, algo: str = "auto", group_size: int = 128, progress: Progress | None = None,
               limits: Limits = DEFAULT_LIMITS, idle: str = "auto", baselines: bool = True,
               rounded: bool = True, beat_s: float = math.inf, extended: bool = True,
               rank_actions: int = RANK_ACTIONS, more: Iterable[Candidate] = ()) -> SearchResult:
    """The plans of `algo`. `auto`: every candidate goes into one pool, priced by the one ranking step
    (ranking.py, `rank_actions` its budget): the search's kept plans and h2's sharding of its best, on a
    small instance the larger space's plans (extended.py: idle chips anywhere, any dp, types interleaved;
    `extended`, off for the baselines' sub-clusters, whose plans that space already holds), the idle-chip
    plans, `more` (a caller's candidates), and unless `baselines` is off (the baselines' own sub-searches)
    the baselines (baselines.py: h2, subsets of the chip types, rounded counts, a FLOPs-proportional split);
    the fastest by simulation wins, so it is never slower than any of them. `beat_s` (auto, a schedule
    without parameters): only plans that may run faster are searched, and NothingFaster is raised where
    none does."""
    if math.isfinite(beat_s) and (algo != "auto" or kind(pb.train.schedule).params):
        raise ValueError(f"run_search: beat_s with algo {algo!r} and schedule {pb.train.schedule}; expected auto "
                         "and a schedule without parameters")
    if algo == "h2":
        return _h2(pb, group_size, progress)
    if algo != "auto":
        raise ValueError(f"unknown algorithm {algo!r}; expected auto or h2")
    rk = Ranking(pb, rank_actions)
    infeasible: InfeasibleError | None = None
    try:
        res: SearchResult | None = _searched(pb, group_size, progress, limits, idle, beat_s, extended, rk,
                                             baselines)
    except NothingFaster:
        if not baselines:
            raise
        res = None
    except InfeasibleError as e:  # a baseline may still fit (a rounded count: 24 + 13 chips plan as 24 + 12)
        if not baselines:
            raise
        res, infeasible = None, e
    rk.offer(more)
    if baselines:
        _offer_baselines(pb, rk, group_size, limits, idle, rounded, beat_s, rank_actions)
    if _simulable(pb):
        rk.polish()
    ranked = rk.ranked()
    if not ranked:
        if infeasible is not None:
            raise infeasible
        if res is None:
            raise NothingFaster(f"no plan runs faster than {beat_s:.6g} s")
        return res  # no candidate the schedule can run: to_plan says why
    if res is None:
        res = SearchResult(ranked[0], [])
    first = res.best
    if progress and ranked[0].label.startswith("baseline") and sig(ranked[0]) != sig(first):
        progress(f"a baseline simulates faster than the search's plan: {ranked[0].label} at "
                 f"{ranked[0].time_s:.4f} s")
    res = replace(res, best=ranked[0], runners_up=ranked[1:RERANK_FIRST])
    return rk.noted(res)


def run_sized(problems: dict[int, Problem], group_size: int = 128, progress: Progress | None = None,
              limits: Limits = DEFAULT_LIMITS, idle: str = "auto", baselines: bool = True,
              rank_actions: int = RANK_ACTIONS) -> tuple[Problem, SearchResult, dict[int, float]]:
    """`auto` with the micro-batch size searched: `problems` holds one problem per size (micro_batch.py), and
    every size's candidates (its search's, and unless `baselines` is off its baselines') go into one pool,
    priced under their own size by the one ranking step. Under a schedule without parameters, a size's
    search is told the fastest time so far and searches only plans that may beat it. Returns the winner's
    problem, the result (the winner's size's search statistics) and per size the fastest plan priced (inf:
    none fits, or none could beat the winner)."""
    sizes = sorted(problems)
    rk = Ranking(problems[sizes[0]], rank_actions)
    cutoff = not kind(problems[sizes[0]].train.schedule).params
    results: dict[int, SearchResult] = {}
    why: list[str] = []
    for size in sizes:
        pb = problems[size]
        try:
            results[size] = _searched(pb, group_size, progress, limits, idle, rk.best_s if cutoff else math.inf,
                                      True, rk, baselines)
        except NothingFaster:
            pass
        except InfeasibleError as e:
            why.append(f"{size}: {e}")
        if baselines:
            _offer_baselines(pb, rk, group_size, limits, idle, True, math.inf, rank_actions)
    if _simulable(problems[sizes[0]]):
        rk.polish()
    ranked = rk.ranked()
    if not ranked:
        raise InfeasibleError("no micro-batch size gives a plan: " + "; ".join(why))
    pb = rk.problem(ranked[0])
    size = pb.train.micro_batch_size
    times = {s: min((c.time_s for c in ranked if rk.problem(c) is problems[s]), default=math.inf) for s in sizes}
    res = results.get(size) or SearchResult(ranked[0], [])
    return pb, rk.noted(replace(res, best=ranked[0], runners_up=ranked[1:RERANK_FIRST])), times


def _searched(pb: Problem, group_size: int, progress: Progress | None, limits: Limits, idle: str,
              beat_s: float, extended: bool, rk: Ranking, with_idle: bool = False) -> SearchResult:
    """The search's result, its plans offered to `rk`: its kept plans (on an instance small enough to
    simulate them, those within POOL_MARGIN of its optimum, at most RERANK_POOL), h2's sharding of its
    best, the idle-chip plans it found, and on a small instance the larger space's plans; `with_idle` (the
    planner and its rounded-count baselines, not a type subset's sub-search), on a cluster of up to
    IDLE_OFFER_CHIPS chips too large for that, the idle-chip search's plans."""
    from .h2 import h2_candidates
    from .search import _runs
    small = _simulable(pb)
    more = extended_candidates(pb.cm) if extended and idle != "never" else []
    try:
        res = search_auto(pb.cm, group_size, RERANK_POOL if small else 3, progress=progress, limits=limits,
                          idle=idle, margin=POOL_MARGIN if small else 0.0, beat_s=beat_s, unranked=True)
    except InfeasibleError:  # NothingFaster included: the larger space may still hold a plan
        if not more:
            raise
        res = SearchResult(more[0], more[1:])
        rk.offer(more, pb)
        return res
    h2 = h2_candidates(pb.cm, res.best.dp, _runs(res.best.stages), group_size)
    # the search's best and next three before the rest: the pool's order breaks ties
    rk.offer([*[res.best, *res.runners_up][:RERANK_FIRST], *h2, *res.runners_up[RERANK_FIRST - 1:], *more], pb)
    if with_idle and idle == "auto" and not small and pb.cluster.total_chips <= IDLE_OFFER_CHIPS:
        rk.offer(_idle_plans(pb, limits), pb)
    return res


def _idle_plans(pb: Problem, limits: Limits) -> list[Candidate]:
    """The idle-chip search's plans (idle.py), for the ranking to simulate: the search's objective, which
    leaves round trips out, can misjudge a dp by more than the margin within which it keeps plans."""
    from .idle import search_idle
    try:
        res = search_idle(pb.cm, limits)
    except InfeasibleError:
        return []
    return [res.best, *res.runners_up]


def _h2(pb: Problem, group_size: int, progress: Progress | None) -> SearchResult:
    from .h2 import search_h2
    res = search_h2(pb.cm, group_size, progress=progress)
    # the paper's objective priced the plan; it carries the full estimate, as search_auto's plans do, or
    # under a schedule with parameters its simulated time with the parameters the plan file gets
    if kind(pb.train.schedule).params:
        return with_params_timed(pb, res)
    b = micro_batches(pb.train, res.best.dp)
    full = pb.cm.evaluate(res.best.stages, res.best.dp, b, round_trips=True).iteration_time_s
    return replace(res, best=replace(res.best, time_s=full), objective_s=res.best.time_s)


def _offer_baselines(pb: Problem, rk: Ranking, group_size: int, limits: Limits, idle: str, rounded: bool,
                     beat_s: float, rank_actions: int) -> None:
    """Offer the baselines (baselines.candidates) to `rk`, one by one: a sub-cluster's search is told the
    fastest time so far (search_auto's beat_s) and searches only plans that may beat it, with a share of
    the work and ranking budgets."""
    from . import baselines as bl
    cutoff = not kind(pb.train.schedule).params  # sub-searches told the time to beat (search_auto's beat_s)

    def fastest() -> float:
        return min(rk.best_s, beat_s)

    def plan(sub: Problem, lim: Limits, with_baselines: bool) -> SearchResult:
        return run_search(sub, "auto", group_size, limits=lim, idle=idle, baselines=with_baselines, rounded=False,
                          beat_s=fastest() if cutoff else math.inf, extended=False,
                          rank_actions=rank_actions if with_baselines else rank_actions // SUB_SHARE)

    def sub_problem(cl: Cluster) -> Problem:
        return Problem(cl, pb.model, pb.train, pb.cm.on(cl))

    for cand in bl.candidates(pb, group_size, limits, idle, plan, sub_problem, fastest, rounded, rk.ranked):
        rk.offer([cand], pb)


def _simulable(pb: Problem) -> bool:
    """Where the ranking gets the search's wide pool and runs its local search: a schedule with parameters
    (which the search does not see), or an instance small enough to simulate that pool."""
    return bool(kind(pb.train.schedule).params) or small_enough_to_simulate(pb)


def small_enough_to_simulate(pb: Problem) -> bool:
    """Whether every plan the search can collect for the ranking (RERANK_POOL of them, each with as many
    stages as layers or chips allow) is simulated within RERANK_ACTIONS, at every dp: the search then
    hands the ranking its plans within POOL_MARGIN of its optimum (its objective prunes and splits, and
    overprices short pipelines at few micro-batches by up to ~27%, so the plan it finds best can be slower
    than one it ranked lower, or than another split of its stages)."""
    from .space import dp_candidates
    try:
        dps = dp_candidates(pb.cluster, pb.train)
    except InfeasibleError:
        return False  # only idle-chip plans: the search says so, or finds them
    return longest_plan_actions(pb.cm, dps) * RERANK_POOL <= RERANK_ACTIONS


RERANK_FIRST = 4  # the best plan and the next three are returned (and lead the pool's order)
RERANK_POOL = 24  # plans the search hands to the ranking at most, on a small instance
# the margin of the search's objective within which it collects them: the objective prices neither round
# trips nor warm-up, which parameters change by more than the estimate's error
POOL_MARGIN = 0.25
RERANK_ACTIONS = 100_000  # small_enough_to_simulate: RERANK_POOL plans' simulations within this many actions
# the planner and its rounded-count baselines also offer the idle-chip plans to the ranking on clusters of up
# to this many chips too large to simulate the search's wide pool (small ones get the larger space instead):
# 100 + 36 + 20 chips of 3 types planned 2.5% slower than 99 + 36 + 20, whose plan (dp 2, the same chips)
# the search's objective put 4.8% above its simulated time
IDLE_OFFER_CHIPS = 512
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
                zero1=pb.train.zero1, iteration_time_s=sim, search_time_s=search_time_s, algo=algo,
                extra={"model_estimate_s": est.iteration_time_s, "bottleneck": est.bottleneck,
                       "fill_drain_s": est.fill_drain_s,
                       "boundary_s": est.boundary_s,
                       "in_flight": [kind(pb.train.schedule).in_flight(k, p, b, params) for k in range(p)],
                       "memory_capacity_gb": [c / 1e9 for c in est.stage_capacity_bytes],
                       "tokens_per_chip_s": pb.train.global_batch * pb.model.seq_len
                       / (sim * pb.cluster.total_chips),
                       **({"search": {"exact": not result.bounded, "bounded_by": result.bounded,
                                      "lower_bound_s": result.lower_bound_s}} if result else {})})


