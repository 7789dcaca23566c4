"""The independent reference for a stats record: float64 torch over the outputs a full capture saved."""
from __future__ import annotations

import pytest
import torch

from ditorch_precision.dump import Dump


def assert_stats_are_float64_of(stats_record: dict, full_record: dict, full: Dump) -> None:
    """`stats_record`'s statistics equal float64 torch's over `full_record`'s saved outputs, one per tensor."""
    op = stats_record["op"]
    saved = torch.utils._pytree.tree_leaves(full.load(full_record)["outputs"])
    outs = [t for t in saved if isinstance(t, torch.Tensor)]
    assert len(stats_record["stats"]) == len(outs), op
    for s, t in zip(stats_record["stats"], outs):
        x = t.double()
        assert (s["min"], s["max"], s["numel"]) == (float(x.min()), float(x.max()), x.numel()), op
        assert s["mean"] == pytest.approx(float(x.mean()), rel=1e-12, abs=1e-15), op
        assert s["norm"] == pytest.approx(float(x.norm()), rel=1e-12), op
