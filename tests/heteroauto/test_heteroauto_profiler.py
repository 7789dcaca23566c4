"""The auto-profiler on the tiny model: every measured time is positive and the backward costs more than the
forward (it computes two gradients per matmul), even on a loaded CPU."""
from __future__ import annotations

import pytest

from heteropp.auto.profiler import _resolve_device, profile_model


def test_tiny_profile_is_positive_and_backward_exceeds_forward():
    # a longer sequence than the preset's 32 so that a layer's work, not per-call overhead, is timed
    prof = profile_model("tiny", [1, 2], "device", seq_len=256, repeats=5)
    assert prof.meta["device"] == "cpu" or prof.meta["device"].startswith(("cuda", "npu", "xpu", "mps"))
    for tp, e in prof.chips["cpu"].tp.items():
        assert e.fwd_s > 0 and e.bwd_s > 0 and e.recompute_s > 0 and e.optim_s > 0, (tp, e)
        assert e.bwd_s > e.fwd_s, (tp, e)
        # the deferred weight gradients: a measured part of the backward, at most one of its two matmuls
        # plus (the tiny model's attention and norms are a large part of its backward: ~0.2 here)
        assert 0 < e.wgrad_s < 0.8 * e.bwd_s, (tp, e)
        assert e.act_bytes > e.ckpt_bytes > 0, (tp, e)


def test_device_names_resolve_through_ditorch():
    assert _resolve_device("cpu").type == "cpu"
    assert _resolve_device("host").type == "cpu"
    with pytest.raises(Exception, match="unknown vendor"):
        _resolve_device("no-such-chip")
