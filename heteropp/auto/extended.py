"""The larger plan space of small instances (issue 30 item 4): idle chips anywhere, not only whole types;
any dp that divides the micro-batch count, not only one that divides every chip count; chip types
interleaved along the pipeline (X Y X), which tight memory favours under 1F1B (the first stages hold the
most micro-batches in flight, so a large-memory type serves at both ends where a slow link keeps the others
from splitting finer).

The best-first search (search.py) covers each type as one contiguous run of every one of its chips. Here
every stage sequence of the larger space is enumerated where there are few (`MAX_SEQUENCES`, counted
before any is built), each gets the exact layer split and recompute under the search's objective
(split.py), and the `KEEP` best by that objective go to the one ranking step (ranking.py: priced by the
simulator, then its local search), which the search's own plans go to as well. Beyond `MAX_SEQUENCES` the larger
space is not searched (the search's own space and the baselines' sub-clusters and rounded counts remain).
"""
from __future__ import annotations

import heapq
import math
from typing import Iterator

from .candidates import Candidate
from .costs import CostModel, StageSpec
from .space import divisors, tp_counts, tp_sizes
from .split import best_split
from .stageopts import stage_opts

MAX_SEQUENCES = 3_000  # stage sequences over every dp at most (a bound counted first); beyond, none (~0.1-0.2 ms each)
MAX_STAGES = 16  # stages per replica beyond which the count is not even taken
KEEP = 64  # plans by objective handed to the re-rank


def _items(cm: CostModel, dp: int) -> list[tuple[str, int, int]]:
    """(chip, tp, how many such stages fit at most) for every TP size of every type at this dp."""
    L, counts = cm.model.layers, tp_counts(cm.model)
    return [(c.name, t, min(c.count // (dp * t), L)) for c in cm.cluster.chips for t in tp_sizes(c, *counts)
            if c.count // (dp * t)]


def sequence_bound(cm: CostModel, dp: int, cap: float = MAX_SEQUENCES) -> float:
    """An upper bound on the stage sequences of one replica at this dp (sum over lengths n of n! [x^n] of
    the product of each item's truncated exponential; TP sizes of one type counted as if their chips were
    apart), or inf where one replica can run more than MAX_STAGES stages. Stops at `cap`."""
    items = _items(cm, dp)
    top = min(cm.model.layers, sum(m for _, _, m in items))
    if top > MAX_STAGES:
        return math.inf
    poly = [1.0] + [0.0] * top
    for _, _, m in items:
        poly = [sum(poly[n - k] / math.factorial(k) for k in range(min(m, n) + 1)) for n in range(top + 1)]
    total = sum(math.factorial(n) * poly[n] for n in range(1, top + 1))
    return total if total <= cap else math.inf


def affordable(cm: CostModel) -> bool:
    """Whether the larger space has at most MAX_SEQUENCES sequences over every dp."""
    left = float(MAX_SEQUENCES)
    for dp in divisors(cm.train.micro_batches_total):
        if dp > cm.cluster.total_chips:
            break
        left -= sequence_bound(cm, dp, left)
        if left < 0:
            return False
    return True


def sequences(cm: CostModel, dp: int) -> Iterator[list[tuple[str, int]]]:
    """Every (chip, tp) sequence of one replica at this dp: each type's stages use at most count // dp of
    its chips (the rest idle), in any order, between 1 and `layers` stages."""
    L = cm.model.layers
    items = [(c, t) for c, t, _ in _items(cm, dp)]
    left = {c.name: c.count // dp for c in cm.cluster.chips}
    seq: list[tuple[str, int]] = []

    def grow() -> Iterator[list[tuple[str, int]]]:
        if seq:
            yield list(seq)
        if len(seq) == L:
            return
        for c, t in items:
            if left[c] >= t:
                left[c] -= t
                seq.append((c, t))
                yield from grow()
                seq.pop()
                left[c] += t

    yield from grow()


def extended_candidates(cm: CostModel, keep: int = KEEP) -> list[Candidate]:
    """The `keep` best plans of the larger space by the search's objective, each with the exact layer split
    and recompute of its stage sequence; none where the space is not affordable."""
    if not affordable(cm):
        return []
    L, total = cm.model.layers, cm.train.micro_batches_total
    best: list[tuple[float, int, Candidate]] = []  # a max-heap by objective of the kept plans (negated)
    n = 0
    for dp in divisors(total):
        if dp > cm.cluster.total_chips:
            break
        b = total // dp
        for seq in sequences(cm, dp):
            opts, lam, const = stage_opts(cm, seq, dp, b)
            bound = -best[0][0] if len(best) >= keep else math.inf
            res = best_split(opts, L, lam, const, bound)
            if res is None:
                continue
            stages = [StageSpec(c, t, nl, r) for (c, t), nl, r in zip(seq, res.layers, res.recompute)]
            label = f"dp={dp} " + " ".join(f"{c}:tp{t}" for c, t in seq) + " (larger space)"
            n += 1
            entry = (-res.total, -n, Candidate(res.total, dp, stages, label))
            if len(best) < keep:
                heapq.heappush(best, entry)
            else:
                heapq.heapreplace(best, entry)
    return [c for _, _, c in sorted(best, key=lambda x: (-x[0], -x[1]))]
