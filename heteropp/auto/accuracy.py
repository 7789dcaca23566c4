"""The cost model's stated error against the simulator, per schedule: the worst relative error each way
over random plans of HARP Setting 1 (tests/heteroauto/test_heteroauto_round_trips.py holds the model to
these; bench/heteroauto_estimate.py measures them). The planner reads them to decide which plans the
simulator must see: a plan whose estimate is within the error of the best one's may be faster."""
from __future__ import annotations

# schedule: ((UNDER, OVER) at 2-8 micro-batches, (UNDER, OVER) at 16-64): estimate / simulated - 1 lies
# in [-UNDER, OVER]
ESTIMATE_BOUNDS: dict[str, tuple[tuple[float, float], tuple[float, float]]] = {
    # every schedule's estimate is a longest chain of actions the simulator runs, each stage's update after
    # its own last backward: never above the simulator but by rounding (OVER), and at most UNDER below it
    "gpipe": ((0.01, 1e-9), (0.01, 1e-9)),
    "1f1b": ((0.01, 1e-9), (0.01, 1e-9)),
    "h1f1b": ((0.01, 1e-9), (0.01, 1e-9)),
    "zbh1": ((0.01, 1e-9), (0.01, 1e-9)),
    # the longest chains of its actions with each link's queue in turn (chains.py): the simulator's own
    # recurrence, relaxed, so exactly the simulator's time where at most one link queues
    "interleaved": ((0.01, 0.0), (0.01, 0.0)),
}


def error_factor(schedule: str) -> float:
    """How far apart two plans' estimates may be while the simulator still ranks them either way: the
    worse one's estimate may be high by OVER and the better one's low by UNDER, over both ranges."""
    return max((1 + over) / (1 - under) for under, over in ESTIMATE_BOUNDS[schedule])
