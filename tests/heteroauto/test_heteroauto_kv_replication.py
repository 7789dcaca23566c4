"""TP above the key/value head count (Megatron-style KV replication): the planner proposes exactly the TP
sizes the engine runs, and charges each rank the whole key/value head it then holds."""
from __future__ import annotations

import pytest

from heteropp.auto.analytic import analytic_profile
from heteropp.auto.costs import CostModel
from heteropp.auto.planning import run_search, to_plan
from heteropp.auto.profiler import profile_model
from heteropp.auto.space import stage_tp_choices, tp_sizes
from heteropp.model import StageModel, TPGroup
from heteropp.spec import PRESETS, ModelSpec, TrainSpec, cluster_from_dict

from heteroauto_helpers import chip, chip_type, tp4_problem

TINY = PRESETS["tiny"]  # heads 4, kv_heads 2


def _engine_rule(tp: int, heads: int, kv_heads: int) -> bool:
    """Written from the engine's statement of the rule, independently of the planner's code."""
    return heads % tp == 0 and (kv_heads % tp == 0 or tp % kv_heads == 0)


@pytest.mark.parametrize("heads,kv_heads,tp_max", [(4, 2, 4), (4, 2, 8), (64, 8, 8), (64, 8, 64), (32, 4, 16),
                                                   (8, 8, 16), (12, 3, 16), (40, 10, 32), (6, 1, 8), (16, 16, 4)])
def test_tp_candidates_match_engine_rule(heads, kv_heads, tp_max):
    brute = [t for t in range(1, tp_max + 1) if t & (t - 1) == 0 and _engine_rule(t, heads, kv_heads)]
    assert tp_sizes(chip_type(tp_max), heads, kv_heads) == brute


def test_stage_choices_reach_tp_above_kv_heads():
    got = {t for tps in stage_tp_choices(chip_type(4), 16, 64, TINY.heads, TINY.kv_heads) for t in tps}
    assert got == {1, 2, 4}


@pytest.mark.parametrize("algo", ["auto", "h2"])
def test_tiny_plan_uses_tp4_and_passes_engine_validation(algo):
    pb = tp4_problem(TINY)
    res = run_search(pb, algo, group_size=4)
    plan = to_plan(pb, res.best, res.search_time_s, algo)
    assert [s.tp for s in plan.stages] == [4]
    plan.validate("<tp4>", num_layers=TINY.layers, heads=TINY.heads, kv_heads=TINY.kv_heads, world_size=4)


def _engine_layer_params(m: ModelSpec, tp: int, rank: int) -> int:
    """One decoder layer's weights on one TP rank, counted on the engine's own stage model; building it
    shards the weights without any collective, so a TP group with no process group serves."""
    stage = StageModel(m, range(1), TPGroup(rank, tp), seed=0, first=False, last=False)
    return sum(p.numel() for p in stage.layers["0"].parameters())


MODELS = [TINY, ModelSpec("gqa", layers=2, hidden=128, heads=8, kv_heads=2, ffn=256, vocab=64, seq_len=16),
          ModelSpec("mqa", layers=2, hidden=96, heads=4, kv_heads=1, ffn=64, vocab=64, seq_len=16)]


@pytest.mark.parametrize("m", MODELS, ids=lambda m: m.name)
def test_per_rank_params_match_engine(m):
    """Replicated or split, every rank's count equals the engine's own stage model."""
    for tp in (t for t in (1, 2, 4, 8) if _engine_rule(t, m.heads, m.kv_heads)):
        want = {_engine_layer_params(m, tp, r) for r in range(tp)}
        assert want == {m.layer_params_per_rank(tp)}, tp


def test_split_layer_keeps_whole_norms_on_every_rank():
    m = PRESETS["h2-100b"]
    for tp in (1, 2, 4, 8):
        assert m.layer_params_per_rank(tp) == (m.layer_params - 2 * m.hidden) / tp + 2 * m.hidden


@pytest.mark.parametrize("m", MODELS, ids=lambda m: m.name)
def test_memory_model_never_below_true_weights(m):
    cl = cluster_from_dict({"name": "c", "chips": [chip("A", 8, 80.0, tp_max=8)]}, "test")
    tr = TrainSpec(global_batch=8, micro_batch_size=1, dtype="bf16")
    cm = CostModel(cl, m, tr, analytic_profile(cl, m, tr))
    for tp in (t for t in (2, 4, 8) if t > m.kv_heads and _engine_rule(t, m.heads, m.kv_heads)):
        true = max(_engine_layer_params(m, tp, r) for r in range(tp))
        for dp in (1, 2):
            c = cm.coef("A", tp, False, dp)
            assert c.static / cm._static_per_param(dp, tr.zero1) >= true
            # weights, gradients and the optimizer state of `true` parameters per layer, at least
            assert cm.memory("A", tp, False, dp, 3, 1, False, False) >= 3 * true * cm._static_per_param(dp, tr.zero1)


def test_replication_is_charged():
    """Above kv_heads the K/V weights stop shrinking with TP: each rank holds, projects and saves one whole
    K and V head, and the engine sums the replicas' weight gradients over the TP group once per iteration."""
    m = MODELS[1]  # kv_heads 2, head_dim 16
    cl = cluster_from_dict({"name": "c", "chips": [chip("A", 8, 80.0, tp_max=8)]}, "test")
    tr = TrainSpec(global_batch=8, micro_batch_size=1, dtype="bf16")
    cm = CostModel(cl, m, tr, analytic_profile(cl, m, tr))
    tokens, h, hd = m.seq_len, m.hidden, m.head_dim
    kv_weights = 2 * h * hd  # one whole K and V head per rank
    assert m.layer_params_per_rank(8) == (2 * h * h + 3 * h * m.ffn) / 8 + kv_weights + 2 * h
    assert m.layer_flops_fwd(tokens, 8) == m.layer_flops_fwd(tokens) + 2.0 * tokens * kv_weights * (8 - m.kv_heads)
    assert m.layer_flops_fwd(tokens, 2) == m.layer_flops_fwd(tokens)
    assert m.activation_bytes(tokens, 8) == 2 * tokens * (4 * h + (2 * h + 3 * m.ffn) / 8 + 2 * hd)
    assert cm._replica_sync("A", 2) == 0.0 and cm._replica_sync("A", 8) > 0.0
    # by hand, from sync_replicated_grads: a buffer of one slot per distinct K/V head, each slot one rank's K
    # and V weight gradients in the optimizer's fp32 gradient buffer (grad_of: the main_grad, with bf16
    # weights too), ring all-reduced over the 8 ranks at the node's 100 GB/s
    nbytes = 4 * m.kv_heads * kv_weights
    assert cm._replica_sync("A", 8) == pytest.approx(2 * 7 / 8 * nbytes / 100e9, rel=1e-12)
    pr = cm.profile.get("A", 8)
    want = cm._grad_sync("A", m.layer_params_per_rank(8), 2, 8) + pr.optim_s / 2 + cm._replica_sync("A", 8)
    assert cm.coef("A", 8, False, 2).upd == pytest.approx(want, rel=1e-12)


def test_profiler_rejects_tp_the_engine_rejects():
    with pytest.raises(ValueError, match=r"heads=4; expected a tp that is a divisor of 4"):
        profile_model("tiny", [8], "cpu", repeats=1, min_time_s=0.0)
