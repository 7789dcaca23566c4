"""Which node of its chip type each TP group of a plan runs on: a TP group never spans two nodes.

One rule, shared by the cost model (a stage's gradient all-reduce stays on the node's own fabric only when
all its replicas share one node), the brute force, plan validation and the engine. Stages are placed in
order of decreasing TP size (then decreasing chips, then pipeline order); a stage goes whole into the
fullest node it fits in, else its TP groups go one by one into the fullest node each fits in.

Why decreasing TP sizes make the rule exact for feasibility: TP sizes are powers of two, so when the groups
of size t are placed every group placed before is a multiple of t; each node's free chips modulo t never
change and any fitting choice takes exactly one of the sum over nodes of floor(free / t) slots, and t / t'
of the slots for every smaller size t'. Whether every group fits does not depend on the choices made, so
the plan fits exactly when this rule places it. Which stages end whole in one node does depend on them:
the rule is a greedy, not the placement with the fewest stages spread over nodes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from .errors import InfeasibleError


class PlacementError(InfeasibleError):
    """A TP group fits in no node of its chip type; `stage` names the stage."""

    def __init__(self, stage: int, message: str) -> None:
        self.stage = stage
        super().__init__(message)


@dataclass(frozen=True)
class StageBlock:
    """One stage's chips: `replicas` TP groups of `tp` chips of type `chip`."""

    chip: str
    tp: int
    replicas: int


def place(node_sizes: Mapping[str, Sequence[int]], stages: Sequence[StageBlock]) -> list[list[int]]:
    """Per stage, the node (an index into its type's node_sizes) of each of its TP groups, in replica
    order. Raises PlacementError naming the first stage, in placement order, whose TP group fits no node."""
    free = {chip: list(sizes) for chip, sizes in node_sizes.items()}
    out: list[list[int]] = [[] for _ in stages]
    for k in sorted(range(len(stages)), key=lambda i: (-stages[i].tp, -stages[i].tp * stages[i].replicas, i)):
        s = stages[k]
        room = free.get(s.chip)
        if room is None:
            raise PlacementError(k, f"stage {k} runs on chip type {s.chip!r}, which has no nodes in the cluster")
        whole = _fullest_fit(room, s.tp * s.replicas)
        if whole is not None:
            room[whole] -= s.tp * s.replicas
            out[k] = [whole] * s.replicas
            continue
        for _ in range(s.replicas):
            node = _fullest_fit(room, s.tp)
            if node is None:
                raise PlacementError(k, f"stage {k}'s TP group of {s.tp} {s.chip} chips fits in no node: nodes of "
                                     f"{list(node_sizes[s.chip])} chips, {room} free after the larger TP groups "
                                     "(a TP group never spans nodes)")
            room[node] -= s.tp
            out[k].append(node)
    return out


def _fullest_fit(room: list[int], need: int) -> int | None:
    """The node with the fewest free chips that still has `need` (the lowest index on a tie), or None."""
    best = None
    for i, r in enumerate(room):
        if r >= need and (best is None or r < room[best]):
            best = i
    return best
