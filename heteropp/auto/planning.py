"""Load inputs, run a search, and turn its result into the shared Plan schema."""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..plan import Plan, StagePlan
from ..spec import Cluster, ModelSpec, TrainSpec, load_cluster, load_model, load_train
from ..schedules import kind
from .analytic import analytic_profile
from .costs import CostModel, micro_batches
from .limits import DEFAULT_LIMITS, Limits
from .profiles import Profile
from .candidates import Candidate, Progress, SearchResult
from .search import search_auto


@dataclass
class Problem:
    cluster: Cluster
    model: ModelSpec
    train: TrainSpec
    cm: CostModel


def load_problem(cluster: str, model: str, train: str, profile: str | None = None) -> Problem:
    cl, m = load_cluster(cluster), load_model(model)
    tr = load_train(train, m.seq_len)
    prof = Profile.load(profile) if profile else analytic_profile(cl, m, tr)
    searched = kind(tr.schedule).searched_as or tr.schedule  # H-1F1B: planned as 1F1B, then warmed up
    return Problem(cl, m, tr, CostModel(cl, m, replace(tr, schedule=searched), prof))


def run_search(pb: Problem, algo: str = "auto", group_size: int = 128, progress: Progress | None = None,
               limits: Limits = DEFAULT_LIMITS, idle: str = "auto") -> SearchResult:
    if algo == "h2":
        from .h2 import search_h2
        return search_h2(pb.cm, group_size, progress=progress)
    if algo != "auto":
        raise ValueError(f"unknown algorithm {algo!r}; expected auto or h2")
    return search_auto(pb.cm, group_size, progress=progress, limits=limits, idle=idle)


def to_plan(pb: Problem, cand: Candidate, search_time_s: float | None, algo: str,
            result: SearchResult | None = None) -> Plan:
    """The plan of `cand`; with the search's `result`, extra["search"] says whether it was exact or which
    limits bounded it, and the lower bound on every plan then."""
    from .plan_sim import simulate_stages
    b = micro_batches(pb.train, cand.dp)
    params = warmup_within_memory(pb, cand)[0] if kind(pb.train.schedule).params else {}
    est = pb.cm.evaluate(cand.stages, cand.dp, b, pb.train.schedule, round_trips=True, params=params)
    memory = est.stage_memory_bytes
    # the plan states the simulator's time; the cost model's, with 1F1B's round trips priced (the search
    # ranks without them), stays in extra["model_estimate_s"]
    sim = simulate_stages(pb.cm, cand.stages, cand.dp, pb.train.schedule, params=params).iteration_time_s
    stages = [StagePlan(chip=s.chip, tp=s.tp, layers=s.layers, recompute=s.recompute, inner_dp=s.inner_dp,
                        est_time_s=round(t, 6), est_memory_gb=round(mem / 1e9, 3))
              for s, t, mem in zip(cand.stages, est.stage_time_s, memory)]
    return Plan(stages=stages, dp=cand.dp, micro_batch_size=pb.train.micro_batch_size, micro_batches=b,
                schedule=pb.train.schedule, schedule_params=params, model=pb.model.name, num_layers=pb.model.layers,
                iteration_time_s=sim, search_time_s=search_time_s, algo=algo,
                extra={"model_estimate_s": est.iteration_time_s, "bottleneck": est.bottleneck,
                       "fill_drain_s": est.fill_drain_s,
                       "boundary_s": est.boundary_s,
                       "in_flight": [kind(pb.train.schedule).in_flight(k, len(cand.stages), b, params)
                                     for k in range(len(cand.stages))],
                       "memory_capacity_gb": [c / 1e9 for c in est.stage_capacity_bytes],
                       "tokens_per_chip_s": pb.train.global_batch * pb.model.seq_len
                       / (sim * pb.cluster.total_chips),
                       **({"search": {"exact": not result.bounded, "bounded_by": result.bounded,
                                      "lower_bound_s": result.lower_bound_s}} if result else {})})


def warmup_within_memory(pb: Problem, cand: Candidate) -> tuple[dict, list[float]]:
    """H-1F1B's parameters for the searched plan (HARP's extra warm-up per boundary from the costs), each
    boundary's extra cut back, largest first, until every stage holds its in-flight activations within its
    usable memory; and the stages' memory then."""
    from .plan_sim import schedule_params
    cm, p = pb.cm, len(cand.stages)
    b = micro_batches(pb.train, cand.dp)
    extra = schedule_params(cm, cand.stages, cand.dp, pb.train.schedule)["extra_warmup"]

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
