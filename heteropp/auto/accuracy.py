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


# The search's objective (the estimate without round trips) charges stage k's whole b c_k next to a whole
# fill, the round trip through the later stages included, while stage k runs up to n_k - 1 <= p - 1 warm-up
# forwards in that round trip: it overprices a plan's simulated time by at most those forwards over the b
# micro-batches' compute, (p - 1) / b times the largest forward share of a stage's compute, fwd / (fwd + bwd)
# (a third on bench.heteroauto_vs_brute's instances, where the worst measured over every plan of one-chip
# stages is that share exactly: 24.9% at p = 4, b = 4; 8.3% at p = 5, b = 16). OBJECTIVE_SLACK covers rounding
# and the update term. tests/heteroauto/test_heteroauto_pruning.py holds the objective to it on random
# instances. It leaves round trips out, so on slow links it is also far below the simulator (HARP Setting
# 1: 0.885 s against 1.23 s): the objective is no bound of the full time without this factor.
OBJECTIVE_SLACK = 0.01


def objective_widen(schedule: str, fwd_share: float, p: int, b: int) -> float:
    """How far above a plan's full time (the time it reports: simulated, or the full estimate, at most
    ESTIMATE_BOUNDS' UNDER below the simulator) the search's objective can lie, for plans of at most p
    stages at b micro-batches per replica whose stages' forward is at most `fwd_share` of their compute: a
    plan whose objective is above the incumbent's full time times this cannot run faster than it."""
    few, many = ESTIMATE_BOUNDS[schedule]
    over = fwd_share * max(p - 1, 0) / max(b, 1) + OBJECTIVE_SLACK
    return (1 + over) / (1 - max(few[0], many[0]))
