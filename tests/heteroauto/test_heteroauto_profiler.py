"""The auto-profiler on the tiny model. Timings depend on the machine's load, so the test checks what is
deterministic: the profile's structure, the saved-activation bytes, and the per-layer FLOPs the profiler
isolates with the same two-depth difference as its timings, against the model spec's matmul count (a
forward is 2 x tokens x linear weights per rank; a backward computes two gradients per matmul: twice that)."""
from __future__ import annotations

import math

import pytest

from heteropp.auto.profiler import _resolve_device, profile_model
from heteropp.spec import load_model


def test_tiny_profile_isolates_one_layer_and_backward_is_twice_the_forward():
    seq = 256
    prof = profile_model("tiny", [1, 2], "device", seq_len=seq, repeats=1, min_time_s=0.0)
    assert prof.meta["device"] == "cpu" or prof.meta["device"].startswith(("cuda", "npu", "xpu", "mps"))
    m = load_model("tiny")
    assert set(prof.chips["cpu"].tp) == {1, 2}
    for tp, e in prof.chips["cpu"].tp.items():
        times = (e.fwd_s, e.bwd_s, e.recompute_s, e.wgrad_s, e.optim_s, e.head_s)
        assert all(math.isfinite(t) and t >= 0 for t in times), (tp, e)
        assert e.act_bytes > e.ckpt_bytes > 0, (tp, e)  # recompute keeps only the layer's input
        fwd, bwd = prof.meta["layer_flops"][str(tp)]
        # linear weights of one layer (the two RMSNorm weights do no matmul), split over the tp ranks
        linear = 2 * seq * (m.layer_params - 2 * m.hidden) / tp
        # torch's counter sees the projections exactly; a fused attention kernel, where counted, adds to it
        assert fwd >= linear and fwd < linear + 4 * seq * seq * m.hidden / tp + 1, (tp, fwd, linear)
        assert 2 * fwd <= bwd <= 2.5 * fwd, (tp, fwd, bwd)


def test_device_names_resolve_through_ditorch():
    assert _resolve_device("cpu").type == "cpu"
    assert _resolve_device("host").type == "cpu"
    with pytest.raises(Exception, match="unknown vendor"):
        _resolve_device("no-such-chip")
