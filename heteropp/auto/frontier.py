"""The best-first search's frontier (search.py): entries of three levels, each carrying a lower bound on
every plan below it, popped least bound first.

* CHUNK: a run of one dp's combinations of per-type TP choices, in increasing cheap bound (the run's
  first); popped, its rows get the tight order-free bound and become COMBOs.
* COMBO: one combination with its tight order-free bound; popped, each order of chip types gets the exact
  bound of its stage sequence and becomes an ORDER.
* ORDER: one order of one combination; popped, it gets the exact layer split.
"""
from __future__ import annotations

import enum
import heapq
import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .dpspace import DpSpace


class Level(enum.Enum):
    CHUNK = "chunk"
    COMBO = "combo"
    ORDER = "order"


@dataclass(frozen=True, slots=True)
class Chunk:
    lb: np.ndarray  # cheap bounds of the dp's combinations, increasing
    idx: np.ndarray  # the combinations (rows of choice indices), in the same order
    start: int
    size: int


@dataclass(frozen=True, slots=True)
class Entry:
    bound: float
    level: Level
    space: DpSpace
    combo: np.ndarray | None = None  # COMBO, ORDER
    order: tuple[int, ...] | None = None  # ORDER: chip types' indices along the pipeline
    chunk: Chunk | None = None  # CHUNK


class Frontier:
    """A heap of entries, least bound first (ties in insertion order); heap items are (bound, tick, entry)
    tuples, so ordering costs what tuples cost."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Entry]] = []
        self._tick = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, e: Entry) -> None:
        heapq.heappush(self._heap, (e.bound, next(self._tick), e))

    def least(self) -> float:
        """The least bound on the frontier (inf when empty)."""
        return self._heap[0][0] if self._heap else float("inf")

    def pop(self) -> Entry:
        return heapq.heappop(self._heap)[2]

    def pop_more(self, first: Entry, below: float, most: int) -> list[Entry]:
        """`first` and the next entries of its level while their bounds stay below `below`, `most` in all."""
        out = [first]
        while self._heap and self._heap[0][2].level is first.level and self._heap[0][0] < below and len(out) < most:
            out.append(heapq.heappop(self._heap)[2])
        return out
