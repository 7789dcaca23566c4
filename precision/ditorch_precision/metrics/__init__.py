"""The one comparison library: every precision tool (and the operator conformance suite) uses it."""
from .quick import quick_pass
from .stats import ErrorStats, error_stats, ulp_distance
from .tolerance import (
    ASSERT_CLOSE_DEFAULTS,
    Tolerance,
    ToleranceTable,
    default_tolerance,
    floor_tolerance,
    magnitude_atol,
    op_tolerances,
    resolve_tolerance,
)
from .verdict import (
    DEFAULT_RATIO_K,
    RULES,
    TreeVerdict,
    Verdict,
    compare_error_ratio,
    compare_tensors,
    compare_trees,
    compare_trees_ratio,
    jsonable,
    tensor_leaves,
)

__all__ = [
    "ASSERT_CLOSE_DEFAULTS", "DEFAULT_RATIO_K", "ErrorStats", "RULES", "Tolerance", "ToleranceTable", "TreeVerdict",
    "Verdict", "compare_error_ratio", "compare_tensors", "compare_trees", "compare_trees_ratio", "default_tolerance",
    "error_stats", "floor_tolerance", "jsonable", "magnitude_atol", "op_tolerances", "quick_pass", "resolve_tolerance",
    "tensor_leaves", "ulp_distance",
]
