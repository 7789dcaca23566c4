"""The shared search space: data-parallel sizes, chip groups, and per-group tensor-parallel sequences."""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..plan import tp_split_error
from ..spec import ChipType, Cluster, InfeasibleError, ModelSpec, TrainSpec


def divisors(n: int) -> list[int]:
    """The divisors of n in increasing order, by trial division up to sqrt(n) (1e6 steps for n = 1e12)."""
    small, large, d = [], [], 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return small + large[::-1]


def dp_candidates(cluster: Cluster, train: TrainSpec) -> list[int]:
    """dp divides the micro-batch count and every chip type's count (each type's chips all serve in every
    replica): the divisors of their gcd, found without a loop over the chip counts."""
    total = train.micro_batches_total
    out = divisors(math.gcd(total, *(c.count for c in cluster.chips)))
    if not out:
        raise InfeasibleError("no data-parallel size divides both the global batch "
                              f"({total} micro-batches) and every chip count")
    return out


def tp_counts(m: ModelSpec) -> tuple[int, int, int, int]:
    """The model counts the TP rule checks, in the order tp_sizes and the functions below take them."""
    return m.heads, m.kv_heads, m.ffn, m.vocab


def usable_tp_sizes(chip: ChipType, m: ModelSpec) -> list[int]:
    """The TP sizes a plan may give chip type `chip` for model `m`: tp_sizes within the type's chip count
    (what a measured profile must hold, and what `heteropp.demo` measures)."""
    return [t for t in tp_sizes(chip, *tp_counts(m)) if t <= chip.count]


def tp_sizes(chip: ChipType, heads: int = 0, kv_heads: int = 0, ffn: int = 0, vocab: int = 0) -> list[int]:
    """Powers of two up to the chip's TP_MAX that the shared TP rule (tp_split_error, which the engine's
    stage model also applies) accepts for the counts given (0: not checked), so the planner proposes
    exactly the TP sizes the engine runs, including those above kv_heads, where key/value heads are
    replicated."""
    out, t = [], 1
    while t <= chip.tp_max:
        if tp_split_error(t, heads or None, kv_heads or None, ffn or None, vocab or None) is None:
            out.append(t)
        t *= 2
    return out


def groups(chip: ChipType, group_size: int) -> list[int]:
    """Split a chip type into groups of `group_size` chips (the two-stage search's entities); a remainder
    forms its own group."""
    if group_size <= 0 or chip.count <= group_size:
        return [chip.count]
    n, r = divmod(chip.count, group_size)
    return [group_size] * n + ([r] if r else [])


@dataclass(frozen=True)
class GroupChoice:
    tps: tuple[int, ...]  # one TP size per group, non-increasing along the pipeline
    stages: tuple[int, ...]  # pipeline stages per group


def tp_sequences(chip: ChipType, dp: int, sizes: list[int], heads: int = 0, kv_heads: int = 0, ffn: int = 0,
                 vocab: int = 0) -> list[GroupChoice]:
    """Every non-increasing per-group TP choice where each group's per-replica chips split into whole stages."""
    per = [s // dp if s % dp == 0 else 0 for s in sizes]
    if 0 in per:
        return []
    out: list[GroupChoice] = []
    sizes_ok = tp_sizes(chip, heads, kv_heads, ffn, vocab)

    def rec(i: int, cap: int, tps: tuple[int, ...]) -> None:
        if i == len(per):
            out.append(GroupChoice(tps, tuple(n // t for n, t in zip(per, tps))))
            return
        for t in sizes_ok:
            if t <= cap and per[i] % t == 0:
                rec(i + 1, t, tps + (t,))

    rec(0, chip.tp_max, ())
    return out


def stage_tp_runs(chip: ChipType, dp: int, group_size: int, heads: int = 0, kv_heads: int = 0, ffn: int = 0,
                  vocab: int = 0, max_stages: int | None = None) -> list[list[tuple[int, int]]]:
    """stage_tp_choices as runs (tp, stages) of equal consecutive TP sizes, without expanding them; with
    max_stages, only those with at most that many stages (a pipeline of more stages than layers is
    never built)."""
    seen: dict[tuple[tuple[int, int], ...], None] = {}
    for sizes in ([chip.count], groups(chip, group_size)):
        for g in tp_sequences(chip, dp, sizes, heads, kv_heads, ffn, vocab):
            if max_stages is not None and sum(g.stages) > max_stages:
                continue
            runs: list[tuple[int, int]] = []
            for t, n in zip(g.tps, g.stages):
                if runs and runs[-1][0] == t:
                    runs[-1] = (t, runs[-1][1] + n)
                else:
                    runs.append((t, n))
            seen[tuple(runs)] = None
    return [list(k) for k in seen]


def stage_tp_choices(chip: ChipType, dp: int, group_size: int, heads: int = 0, kv_heads: int = 0, ffn: int = 0,
                     vocab: int = 0) -> list[list[int]]:
    """Per-stage TP lists (pipeline order) for one chip type: the whole type as one entity (the paper's
    first stage) and the grouped entities of its second stage, without duplicates."""
    runs_list = stage_tp_runs(chip, dp, group_size, heads, kv_heads, ffn, vocab)
    return [[t for t, n in runs for _ in range(n)] for runs in runs_list]
