"""A LLaMA-style decoder written with Megatron-style tensor-parallel layers, cut into pipeline stages."""
from .linear import ColumnParallelLinear, RowParallelLinear, WeightGradStore
from .parallel import TPGroup
from .stage import StageModel

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "WeightGradStore", "TPGroup", "StageModel"]
