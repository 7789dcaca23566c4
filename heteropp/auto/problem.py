"""One planning problem: the loaded specs and the cost model built from them (planning.make_problem)."""
from __future__ import annotations

from dataclasses import dataclass

from ..spec import Cluster, ModelSpec, TrainSpec
from .costs import CostModel


@dataclass
class Problem:
    cluster: Cluster
    model: ModelSpec
    train: TrainSpec
    cm: CostModel
