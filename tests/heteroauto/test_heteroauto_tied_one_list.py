"""A model whose head is its embedding, trained as one pipeline (a one-list plan): before each end's own
data-parallel update the engine sums the two copies' gradients over its tie group (engine/topology.tie_ranks:
every rank of the first and of the last stage), the whole matrix in fp32 (engine/tied.py). The simulator, the
estimate and the search's objective (stage_opts; DpSpace's vectorized orders) each price that sum on both end
stages. The group comes from the engine's own rank list; the ring formula is written out by hand. Before, none
of them priced it."""
from __future__ import annotations

import numpy as np
import pytest

from heteropp.auto.costs import CostModel, StageSpec
from heteropp.auto.dpspace import DpSpace
from heteropp.auto.plan_sim import plan_stages, simulate_plan
from heteropp.auto.profiles import ChipProfile, Profile, TPProfile
from heteropp.auto.stageopts import stage_opts
from heteropp.engine.topology import tie_ranks
from heteropp.plan import Plan, StagePlan
from heteropp.spec import ModelSpec, TrainSpec, cluster_from_dict

EMBED, HIDDEN, NETWORK_GBS, NODE_GBS, LINK_GBS = 50_000_000, 1024, 10.0, 100.0, 0.5


def _cost_model(tied: bool, chips_per_node: int, alone: bool = False, embed: int = EMBED) -> CostModel:
    """Two types of four chips in nodes of `chips_per_node`, X and Y, joined by a LINK_GBS link; bf16 weights
    with ZeRO-1. `alone`: as a replica group planned alone (one holder of every part in one other group), whose
    ends' sync across the groups stands for the tie (CostModel.prices_tie)."""
    chips = [{"name": n, "count": 4, "memory_gb": 80, "peak_tflops": 100, "chips_per_node": chips_per_node,
              "tp_max": 2, "intra_node_bw": NODE_GBS, "network_bw": NETWORK_GBS, "memory_fraction": 1.0}
             for n in ("X", "Y")]
    cluster = cluster_from_dict({"name": "types", "chips": chips,
                                 "links": [{"between": ["X", "Y"], "bandwidth": LINK_GBS}]}, "test")
    model = ModelSpec("m", layers=4, hidden=HIDDEN, heads=8, kv_heads=8, ffn=4096, vocab=1000, seq_len=128,
                      tie_embeddings=tied)
    train = TrainSpec(global_batch=8, micro_batch_size=1, dtype="bf16", zero1=True, schedule="1f1b")
    timing = {n: {tp: TPProfile(fwd_s=f / tp, bwd_s=2 * f / tp, recompute_s=f / tp, wgrad_s=f / tp, act_bytes=1e8,
                                ckpt_bytes=1e7, optim_s=0.01, head_s=f / tp) for tp in (1, 2)}
              for n, f in (("X", 0.1), ("Y", 0.05))}
    prof = Profile(model="m", micro_batch_size=1, seq_len=128, layer_params=10_000_000, embed_params=embed,
                   head_params=embed + HIDDEN, chips={n: ChipProfile(t) for n, t in timing.items()})
    return CostModel(cluster, model, train, prof, *((1, (NETWORK_GBS, LINK_GBS)) if alone else ()))


def _ring_s(nbytes: float, n: int, gbs: float) -> float:
    return 2 * (n - 1) / n * nbytes / (gbs * 1e9)


PLANS = {
    # one type over two nodes: the sum crosses the network
    "X network": (Plan([StagePlan("X", 1, 2), StagePlan("X", 1, 2)], 2, 1, 4, num_layers=4), 2, NETWORK_GBS),
    # the same in one node of four
    "X one node": (Plan([StagePlan("X", 1, 2), StagePlan("X", 1, 2)], 2, 1, 4, num_layers=4), 4, NODE_GBS),
    # the embedding on X, the head on Y: over the link between them
    "X to Y": (Plan([StagePlan("X", 2, 1), StagePlan("Y", 1, 1), StagePlan("Y", 1, 2)], 1, 1, 8, num_layers=4),
               2, LINK_GBS),
}


@pytest.mark.parametrize("name", list(PLANS))
def test_the_tie_sum_is_on_both_end_stages_of_the_simulation_and_the_estimate(name):
    plan, per_node, gbs = PLANS[name]
    tie = _ring_s(4 * EMBED, len(tie_ranks(plan)), gbs)  # tied.py's buffer: the whole matrix in fp32
    tied, untied = _cost_model(True, per_node), _cost_model(False, per_node)
    stages = plan_stages(plan)
    st_t, _ = tied.stage_times(stages, plan.dp)
    st_u, _ = untied.stage_times(stages, plan.dp)
    extra = [t.update - u.update for t, u in zip(st_t, st_u)]
    assert extra == pytest.approx([tie] + [0.0] * (len(stages) - 2) + [tie], rel=1e-9, abs=1e-12)
    # on both ends, the iteration takes the sum once more
    sim_t, sim_u = simulate_plan(tied, plan).iteration_time_s, simulate_plan(untied, plan).iteration_time_s
    assert sim_t - sim_u == pytest.approx(tie, rel=1e-6)
    b = plan.micro_batches
    est = [cm.evaluate(stages, plan.dp, b).stage_update_s for cm in (tied, untied)]
    assert [t - u for t, u in zip(*est)] == pytest.approx(extra, rel=1e-9, abs=1e-12)


def test_the_searchs_objective_prices_the_tie_sum_as_the_simulator_does():
    """stage_opts (the exact split's terms) and DpSpace's vectorized orders add it to the end stages' update
    offsets; a lone stage has no tie, nor a replica group planned alone."""
    for per_node, alone in ((2, False), (4, False), (2, True)):
        tied, untied = _cost_model(True, per_node, alone), _cost_model(False, per_node, alone)
        for seq, dp in (([("X", 1), ("X", 1)], 2), ([("X", 2), ("Y", 1), ("Y", 1)], 1), ([("X", 1)], 4)):
            stages = [StageSpec(c, t, 1, False) for c, t in seq]
            st_t, _ = tied.stage_times(stages, dp)
            st_u, _ = untied.stage_times(stages, dp)
            want = [t.update - u.update for t, u in zip(st_t, st_u)]
            got = [t.y0 - u.y0 for t, u in zip(stage_opts(tied, seq, dp, 8)[0], stage_opts(untied, seq, dp, 8)[0])]
            assert got == pytest.approx(want, rel=1e-9, abs=1e-12), (seq, dp, per_node)
            assert (max(want) > 0) == (len(seq) > 1 and not alone)
            # one order of the types, as the vectorized search builds it (each type's stages one run)
            names = list(dict.fromkeys(c for c, _ in seq))
            runs = [[[(t, sum(1 for c, tt in seq if c == n and tt == t))] for t in {tt for c, tt in seq if c == n}]
                    for n in names]
            rows = [DpSpace(cm, dp, 8, names, 1, choices=runs).order_rows(np.zeros(len(names), dtype=np.int64),
                                                                          [tuple(range(len(names)))])
                    for cm in (tied, untied)]
            assert (rows[0].y0 - rows[1].y0)[0].tolist() == pytest.approx(want, rel=1e-9, abs=1e-12)


def test_a_lone_stage_of_a_tied_model_holds_and_updates_the_matrix_once():
    """The engine's one stage of a tied model makes the head the embedding's parameter (heteropp/model/stage.py):
    it holds vocab x hidden weights fewer than untied, counted here on the engine's own module. The cost model's
    memory of that stage is less by those weights' bytes (bf16 weight, fp32 gradient, the Adam state as the
    engine's ZeRO-1 optimizer keeps it, sharded over dp 2) and its update by their all-reduce, all-gather and
    optimizer step, written out by hand; a plan of two stages keeps its copy (no difference there). Before, the
    lone stage was priced with two matrices."""
    import torch
    from torch import nn

    from heteropp.engine.optim import ZeroAdamW
    from heteropp.model.parallel import TPGroup
    from heteropp.model.stage import StageModel

    def engine_params(tied: bool) -> int:
        m = ModelSpec("m", layers=2, hidden=64, heads=4, kv_heads=4, ffn=128, vocab=256, seq_len=16,
                      tie_embeddings=tied)
        stage = StageModel(m, range(2), TPGroup(), seed=0, first=True, last=True)
        return sum(p.numel() for p in stage.parameters())  # parameters() yields a shared one once

    fewer = engine_params(False) - engine_params(True)
    assert fewer == 256 * 64
    opt = ZeroAdamW([nn.Parameter(torch.zeros(8, dtype=torch.bfloat16))], 1e-3)
    state_b = opt.m.element_size() + opt.v.element_size() + opt.master.element_size()
    dp, optim_s, layer = 2, 0.01, 10_000_000
    per_param = torch.finfo(torch.bfloat16).bits // 8 + 4 + state_b / dp
    gather = (dp - 1) / dp * 2 * fewer / (NODE_GBS * 1e9)  # the updated bf16 weights
    by_hand = _ring_s(4 * fewer, dp, NODE_GBS) + gather + optim_s * fewer / layer / dp
    tied, untied = (_cost_model(t, 2, embed=fewer) for t in (True, False))
    one = [StageSpec("X", 1, 4, False)]
    assert untied.memory("X", 1, False, dp, 4, 1, True, True) - tied.memory("X", 1, False, dp, 4, 1, True, True) \
        == pytest.approx(fewer * per_param, rel=1e-9)
    (u,), _ = untied.stage_times(one, dp)
    (t,), _ = tied.stage_times(one, dp)
    assert u.update - t.update == pytest.approx(by_hand, rel=1e-9)
    assert u.static_bytes - t.static_bytes == pytest.approx(fewer * per_param, rel=1e-9)
    est = [cm.evaluate(one, dp, 8).stage_update_s[0] for cm in (untied, tied)]
    assert est[0] - est[1] == pytest.approx(by_hand, rel=1e-9)
    two = [StageSpec("X", 1, 2, False), StageSpec("X", 1, 2, False)]
    assert [s.static_bytes for s in tied.stage_times(two, dp)[0]] == \
        pytest.approx([s.static_bytes for s in untied.stage_times(two, dp)[0]], rel=1e-12)
