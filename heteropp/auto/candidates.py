"""What a search returns: candidate plans (dp and stage list with the cost model's time) and the result
with its statistics and, for a bounded search, the limits that applied and a lower bound."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ..spec import InfeasibleError
from .costs import StageSpec

Progress = Callable[[str], None]


@dataclass
class Candidate:
    time_s: float
    dp: int
    stages: list[StageSpec]
    label: str = ""
    # schedule parameters the ranking's local search found (pricing.refine), tried next to the usual options
    params: dict[str, Any] | None = None
    # sequences per micro-batch, where the size is searched (micro_batch.py); None: the problem's own
    micro_batch_size: int | None = None


@dataclass
class SearchResult:
    best: Candidate
    runners_up: list[Candidate] = field(default_factory=list)
    evaluated: int = 0
    pruned: int = 0
    search_time_s: float = 0.0
    bounded: list[str] = field(default_factory=list)  # the limits that cut the space; empty: exact
    lower_bound_s: float | None = None  # no plan of the full space is faster (set when bounded)
    # the least of the search's objective over the plans it kept (its optimum when exact; lower_bound_s bounds
    # it); the plans themselves carry the time a user reads (ranking.py: simulated)
    objective_s: float | None = None
    work: int = 0  # units of search work spent (limits.BOUND_CELLS_PER_UNIT): the same on any machine


class NothingFaster(InfeasibleError):
    """A search told to beat a time (search_auto's beat_s) found that no plan of its space can."""
