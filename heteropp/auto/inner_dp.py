"""Per-stage data parallelism proposed on the searched plans: a stage whose replica spans g chips may run
inner_dp replicas of g / inner_dp-way TP instead (HetAuto's d_k = d_outer x d_inner,k), each computing
micro_batch_size / inner_dp of every micro-batch. Splitting rows saves TP's collectives and costs a
gradient reduction over more replicas and a whole layer's weights on fewer chips; the cost model prices
both (CostModel.evaluate); a local search moves one stage, or all stages of one chip type, to another
inner_dp while that lowers the plan's time. With one sequence per micro-batch there is nothing to split and
plans stay as searched."""

from __future__ import annotations

from dataclasses import replace

from .candidates import Candidate
from .costs import CostModel, StageSpec, micro_batches


def inner_dp_choices(cm: CostModel, s: StageSpec) -> list[StageSpec]:
    """The same chips as `s` at every other inner_dp that divides both its chips and the micro-batch, where
    the profile has the smaller TP size."""
    group, mbs = s.tp * s.inner_dp, cm.train.micro_batch_size
    out = []
    for i in range(1, group + 1):
        if group % i or mbs % i or i == s.inner_dp:
            continue
        try:
            cm.profile.get(s.chip, group // i)
        except KeyError:
            continue
        out.append(replace(s, tp=group // i, inner_dp=i))
    return out


def _moves(cm: CostModel, stages: list[StageSpec]) -> list[list[StageSpec]]:
    """Each stage alone at another inner_dp, and every stage of one chip type at the same other inner_dp
    (stages tied as bottleneck only gain when they change together)."""
    out = [stages[:k] + [alt] + stages[k + 1:] for k, s in enumerate(stages) for alt in inner_dp_choices(cm, s)]
    for chip in dict.fromkeys(s.chip for s in stages):
        ks = [k for k, s in enumerate(stages) if s.chip == chip]
        for i in sorted({a.inner_dp for k in ks for a in inner_dp_choices(cm, stages[k])}):
            trial = list(stages)
            for k in ks:
                alt = next((a for a in inner_dp_choices(cm, stages[k]) if a.inner_dp == i), None)
                trial[k] = alt or stages[k]
            out.append(trial)
    return out


REBALANCE_MAX_STAGES = 16  # longer pipelines take inner_dp moves with their searched layer split only


def _layer_moves(stages: list[StageSpec]) -> list[list[StageSpec]]:
    """One layer from a stage to a neighbour (a stage keeps a layer at least)."""
    out = []
    for k in range(len(stages) - 1):
        for src, dst in ((k, k + 1), (k + 1, k)):
            if stages[src].layers > 1:
                trial = list(stages)
                trial[src] = replace(trial[src], layers=trial[src].layers - 1)
                trial[dst] = replace(trial[dst], layers=trial[dst].layers + 1)
                out.append(trial)
    return out


def _rebalanced(cm: CostModel, stages: list[StageSpec], dp: int, b: int) -> tuple[list[StageSpec], float]:
    """`stages` with single layers moved between neighbours while that lowers the time (a stage split
    into inner replicas computes faster, so its share of the layers changes with it)."""
    e = cm.evaluate(stages, dp, b)
    best = e.iteration_time_s if e.feasible else float("inf")
    if len(stages) > REBALANCE_MAX_STAGES:
        return stages, best
    improved = True
    while improved:
        improved = False
        for trial in _layer_moves(stages):
            e = cm.evaluate(trial, dp, b)
            if e.feasible and e.iteration_time_s < best * (1 - 1e-9):
                stages, best, improved = trial, e.iteration_time_s, True
                break
    return stages, best


def with_inner_dp(cm: CostModel, cand: Candidate) -> Candidate:
    """`cand` with each stage's inner_dp chosen by the cost model: local search over inner_dp moves, each
    followed by moving layers between neighbours (strict gains only)."""
    if cm.train.micro_batch_size == 1:
        return cand
    b = micro_batches(cm.train, cand.dp)
    stages, best = list(cand.stages), cm.evaluate(cand.stages, cand.dp, b).iteration_time_s
    improved = True
    while improved:
        improved = False
        for move in _moves(cm, stages):
            trial, t = _rebalanced(cm, move, cand.dp, b)
            if t < best * (1 - 1e-9):
                stages, best, improved = trial, t, True
                break
    if stages == cand.stages:
        return cand
    inner = ",".join(str(s.inner_dp) for s in stages)
    return Candidate(best, cand.dp, stages, f"{cand.label} inner_dp {inner}".strip())
