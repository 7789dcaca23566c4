"""Small synthetic problems for HeteroAuto tests (hand-set profiles stand in for measured chips)."""
from __future__ import annotations

from dataclasses import replace

import pytest  # noqa: F401

from heteropp.auto.analytic import analytic_profile
from heteropp.auto.costs import CostModel
from heteropp.auto.planning import Problem
from heteropp.auto.profiles import ChipProfile, Profile, TPProfile
from heteropp.schedules import kind
from heteropp.spec import ChipType, ModelSpec, TrainSpec, cluster_from_dict

GB = 1e9


def chip(name: str, count: int, mem: float, tp_max: int = 2, net: float = 10.0) -> dict:
    return {"name": name, "count": count, "memory_gb": mem, "peak_tflops": 100, "chips_per_node": tp_max,
            "tp_max": tp_max, "intra_node_bw": 100, "network_bw": net, "memory_fraction": 1.0}


def chip_type(tp_max: int) -> ChipType:
    """64 chips of type A with the given TP_MAX."""
    return cluster_from_dict({"name": "c", "chips": [chip("A", 64, 80.0, tp_max=tp_max)]}, "test").chips[0]


def with_schedule(cm: CostModel, schedule: str) -> Problem:
    """A Problem over `cm`'s inputs whose training asks for `schedule` (searched as its searched_as)."""
    train = replace(cm.train, schedule=schedule)
    searched = replace(train, schedule=kind(schedule).searched_as or schedule)
    return Problem(cm.cluster, cm.model, train, CostModel(cm.cluster, cm.model, searched, cm.profile))


def tp4_problem(m: ModelSpec) -> Problem:
    """Four chips in one fast node on a very slow network, one micro-batch per iteration: a pipeline has
    nothing to overlap and pays for every boundary, so for `tiny` one TP-4 stage is best by two orders of
    magnitude."""
    c = chip("A", 4, 0.004, tp_max=4, net=0.001)
    c.update(intra_node_bw=10_000.0, chips_per_node=4, peak_tflops=1.0)
    cl = cluster_from_dict({"name": "tp4", "chips": [c]}, "test")
    tr = TrainSpec(global_batch=1, micro_batch_size=1, dtype="fp32")
    return Problem(cl, m, tr, CostModel(cl, m, tr, analytic_profile(cl, m, tr)))


def tp_entry(f: float, act_gb: float, tp: int) -> TPProfile:
    # TP scales compute by 1/tp plus a 10% communication overhead; activations split by tp.
    fw = f / tp * (1.1 if tp > 1 else 1.0)
    return TPProfile(fwd_s=fw, bwd_s=2 * fw, recompute_s=fw, wgrad_s=fw, act_bytes=act_gb * GB / tp,
                     ckpt_bytes=0.1 * act_gb * GB / tp, optim_s=0.01, embed_s=0.0, head_s=fw, head_act_bytes=0.0)


def make_problem(chips: list[dict], speeds: dict[str, float], layers: int, gb: int, act_gb: float = 1.0,
                 schedule: str = "1f1b", links: list | None = None, zero1: bool = True) -> CostModel:
    cl = cluster_from_dict({"name": "t", "chips": chips, "links": links or []}, "test")
    model = ModelSpec("m", layers=layers, hidden=1024, heads=8, kv_heads=8, ffn=4096, vocab=1000, seq_len=128)
    train = TrainSpec(global_batch=gb, micro_batch_size=1, dtype="bf16", zero1=zero1, schedule=schedule)
    # layer_params chosen so one layer's weights+grads+optimizer state is 1.6 GB at tp=1, dp=1
    prof = Profile(
        model="m",
        micro_batch_size=1,
        seq_len=128,
        layer_params=100_000_000,
        embed_params=10_000_000,
        head_params=10_000_000,
        chips={
            c["name"]: ChipProfile({t: tp_entry(speeds[c["name"]], act_gb, t) for t in (1, 2, 4) if t <= c["tp_max"]})
            for c in chips
        },
    )
    return CostModel(cl, model, train, prof)


@pytest.fixture
def two_type() -> CostModel:
    """8 chips: 4 fast small-memory Y, 4 slow large-memory X; 8 layers; 8 micro-batches."""
    return make_problem([chip("X", 4, 14.0), chip("Y", 4, 7.0)], {"X": 1.0, "Y": 0.5}, layers=8, gb=8)
