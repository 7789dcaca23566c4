"""Smoke runs of the HeteroPP benchmarks: output schema, finite numbers, equal losses. Never speed."""
from __future__ import annotations

import json
import math

import pytest

from bench.heteropp_bench_common import MODEL, SMOKE_MODEL
from bench.heteropp_vs_sim import plans, predict, predict_shared
from bench.heteropp_vs_torch import main as vs_torch
from heteropp.auto.profiles import ChipProfile, Profile, TPProfile
from heteropp.plan import Plan, StagePlan


def test_vs_torch_smoke(tmp_path):
    out = tmp_path / "vs_torch.json"
    assert vs_torch(["--smoke", "--iters", "2", "--warmup", "1", "--micro-batches", "2", "--backends", "gloo",
                     "--json", str(out)]) == 0
    d = json.loads(out.read_text())
    assert d["machine_before"]["nproc"] >= 1 and d["command"].startswith("python -m bench.heteropp_vs_torch")
    (p,) = d["phases"]
    assert p["backend"] == "gloo" and len(p["ours_s"]) == len(p["theirs_s"]) == 2
    for k in ("ours_median_s", "theirs_median_s", "ratio", "paired_ratio"):
        assert math.isfinite(p[k]) and p[k] > 0
    # same weights, data and optimizer: the two pipelines train to the same losses
    assert len(p["ours_loss"]) == 3 and p["loss_max_rel_diff"] < 1e-5


def test_vs_sim_plans_and_prediction():
    tp = {t: TPProfile(fwd_s=1e-3 / t, bwd_s=2e-3 / t, recompute_s=1e-3 / t, wgrad_s=1e-3 / t, act_bytes=1e6,
                       ckpt_bytes=1e5, optim_s=1e-4) for t in (1, 2)}
    for m in (SMOKE_MODEL, MODEL):
        prof = Profile(m.name, 1, m.seq_len, m.layer_params, m.embed_params, m.head_params, {"cpu": ChipProfile(tp)})
        got = plans(m.layers, 8)
        assert len(got) >= 3
        for name, plan in got.items():
            plan.validate(name, num_layers=m.layers, heads=m.heads, kv_heads=m.kv_heads, ffn=m.ffn, vocab=m.vocab)
            t = predict(m, plan, prof)
            # at least every micro-batch's compute on the busiest stage
            busiest = max(s.layers * (3e-3 + (1e-3 if s.recompute else 0)) / s.tp for s in plan.stages)
            assert math.isfinite(t) and t >= plan.micro_batches * busiest
            # processes sharing cores: no sharing reproduces the plain simulator, one core is never faster
            comm = {"tp_allreduce_s": 1e-4, "p2p_s": 1e-4, "zero_step_s": 1e-4}
            free, plain = predict_shared(m, plan, prof, comm, math.inf), predict(m, plan, prof, comm)
            assert free == plain or abs(free / plain - 1) < 1e-9
            assert predict_shared(m, plan, prof, comm, 1.0) >= free
            # a host that loses nothing to sharing, measured: as if no core were shared
            lossless = predict_shared(m, plan, prof, comm, 1.0, slowdown=[1.0] * plan.world_size)
            assert lossless == free or abs(lossless / free - 1) < 1e-9


def test_vs_sim_shared_cores_count_a_stages_inner_replicas():
    """Two inner replicas of one stage sharing one core do the work of one process that takes the whole
    micro-batch alone on that core (no communication priced)."""
    m = SMOKE_MODEL
    tp = {1: TPProfile(fwd_s=1e-3, bwd_s=2e-3, recompute_s=1e-3, wgrad_s=1e-3, act_bytes=1e6, ckpt_bytes=1e5,
                       optim_s=1e-4)}
    prof = Profile(m.name, 1, m.seq_len, m.layer_params, m.embed_params, m.head_params, {"cpu": ChipProfile(tp)})
    comm = {"tp_allreduce_s": 0.0, "p2p_s": 0.0, "zero_step_s": 0.0}

    def plan(inner: int) -> Plan:
        return Plan([StagePlan("cpu", 1, m.layers, inner_dp=inner)], dp=1, micro_batch_size=2, micro_batches=2,
                    num_layers=m.layers)
    whole = predict(m, plan(1), prof, comm)
    assert predict(m, plan(2), prof, comm) < whole  # two cores: the halves run side by side
    assert predict_shared(m, plan(2), prof, comm, 1.0) == pytest.approx(whole, rel=1e-9)
