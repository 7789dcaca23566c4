"""How far `--algo auto` may search, and what it reports when a limit cut the space.

Up to these limits the search is exact (the cost model's optimum). Beyond them it is an anytime search over
a restricted space: the orders of chip types next to the memory-descending one, the first per-type TP
choices (whole types before groups), groups no smaller than count / max_groups, and a work budget on the
best-first phase (units of search work, never wall-clock time, so the same inputs give the same plan on a
busy or a quiet machine; an optional wall-clock cap stops it early and says so). A bounded result says
which limits applied and gives a lower bound on every plan of the full space (`relaxed_bound`), so the
gap to the optimum is known.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

from .costs import CostModel, micro_batches
from .space import tp_counts, tp_sizes


# One unit of search work: one stage of a sequence given its exact layer split, or BOUND_CELLS_PER_UNIT
# cells (rows x stage slots) of the tight bounds (both cost ~10 us here). The budget counts these, never
# seconds: a plan then depends on its inputs alone, not on the machine's load.
BOUND_CELLS_PER_UNIT = 64
# the default budget: every H2 paper experiment and HARP setting exact (their searches take at most
# ~10,000 units), 100,000 chips x 8 types within 5 s of CPU (bench.heteroauto_search --scale)
DEFAULT_WORK = 100_000


@dataclass(frozen=True)
class Limits:
    work: int = DEFAULT_WORK  # units of search work (BOUND_CELLS_PER_UNIT) for the best-first phase and idle plans
    # an optional wall-clock cap (seconds) on top of `work`: it may stop the search earlier, which makes the
    # plan depend on the machine's load, so a result it stopped says so (bounded) with its lower bound
    time_cap_s: float | None = None
    max_orders: int = 24  # every order of up to 4 chip types
    max_rows: int = 60_000  # combinations of per-type TP choices, over all dps together (Exp-B: 39,235)
    max_groups: int = 16  # groups per chip type in the two-stage refinement


IDLE_MODES = ("auto", "never", "always")  # when plans that leave chips idle are searched (search_auto)
DEFAULT_LIMITS = Limits()  # one shared instance as the default argument (Limits is frozen)


def type_orders(memory: list[float], limit: int) -> tuple[list[tuple[int, ...]], bool]:
    """Every order of the chip types when there are at most `limit`, else (bounded) the memory-descending
    order of `memory` first, then the orders one adjacent swap, then two, away from it."""
    n = len(memory)
    if math.factorial(n) <= limit:
        return list(itertools.permutations(range(n))), False
    base = tuple(sorted(range(n), key=lambda i: -memory[i]))
    seen, frontier = {base: None}, [base]
    while frontier and len(seen) < limit:
        nxt = []
        for o in frontier:
            for j in range(n - 1):
                s = o[:j] + (o[j + 1], o[j]) + o[j + 2:]
                if s not in seen and len(seen) < limit:
                    seen[s] = None
                    nxt.append(s)
        frontier = nxt
    return list(seen), True


def trim_choices(choices: list[list[Any]], budget: int) -> bool:
    """Cut the longest per-type choice lists (in place, keeping their first entries: whole types before
    groups) until their product fits `budget`; True when anything was cut."""
    cut = False
    while math.prod(max(len(c), 1) for c in choices) > max(budget, 1):
        i = max(range(len(choices)), key=lambda j: len(choices[j]))
        if len(choices[i]) <= 1:
            break
        del choices[i][max(1, len(choices[i]) // 2):]
        cut = True
    return cut


def relaxed_bound(cm: CostModel, dps: list[int]) -> float:
    """A lower bound on the iteration time of every plan, from the cost model's F >= max_k (b c_k - beta_k)
    + sum_k beta_k at the best dp, every type at its best TP size, with no memory limit, update or links:
    the bottleneck term is at least l_k a_k (a_k = b tau_k - beta_k per layer), so with sum l_k = L at
    least L / sum_k (1 / a_k) (a type at tp t has at most min(L, chips / (dp t)) stages), and the fill
    sum_k beta_k is at least L times the least per-layer fill share."""
    best = math.inf
    counts, L = tp_counts(cm.model), cm.model.layers
    for dp in dps:
        b, rate, fill = micro_batches(cm.train, dp), 0.0, math.inf
        for c in cm.cluster.chips:
            per = c.count // dp
            kinds = [(min(per // t, L), cm.coef(c.name, t, False, dp)) for t in tp_sizes(c, *counts) if per >= t]
            rate += max((s / max(b * k.tau - k.beta, 1e-300) for s, k in kinds), default=0.0)
            fill = min([fill] + [k.beta for _, k in kinds])
        if rate > 0:
            best = min(best, L / rate + L * fill)
    return best
