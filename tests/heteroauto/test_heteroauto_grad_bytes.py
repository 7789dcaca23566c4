"""The cost model prices the bytes the engine's data-parallel update sends (issue 30): ZeroAdamW all-reduces the
gradients in its fp32 gradient buffer (bf16 and fp16 weights too) and, sharded (ZeRO-1), all-gathers the
updated weights in their own dtype; a part of a plan of replica groups is all-reduced in fp32 among its
holders, then with ZeRO-1 each steps its shard and the weights are all-gathered among them (without, each
keeps and steps the whole state: no all-gather), as a `zero1: false` spec's DP ranks hold and step the whole
optimizer state. The element sizes and the share of the state a rank steps come from the engine's own buffers
(an optimizer built as the engine builds it); the reference is the ring all-reduce and all-gather written out
by hand. Hand-set profiles stand in for measured chips."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch import nn

from heteropp.auto.costs import CostModel
from heteropp.engine.build import TORCH_DTYPES
from heteropp.engine.optim import ZeroAdamW

from heteroauto_helpers import chip, make_problem

NETWORK_GBS = 10.0  # make_problem's chip: one chip per node, so a dp ring crosses the network


def _engine_bytes(dtype: str) -> tuple[int, int]:
    """(gradient, weight) element sizes of the engine's optimizer over `dtype` weights."""
    p = nn.Parameter(torch.zeros(4, dtype=TORCH_DTYPES[dtype]))
    ZeroAdamW([p], 1e-3)
    return p.main_grad.element_size(), p.element_size()  # type: ignore[attr-defined]


def _engine_state_share(dp: int, zero1: bool) -> float:
    """The share of a stage's parameters whose Adam state and update one of `dp` engine ranks holds and
    steps (built without a process group: construction talks to no one)."""
    p = nn.Parameter(torch.zeros(1 << 12))
    opt = ZeroAdamW([p], 1e-3, dp_rank=0, dp_size=dp, zero1=zero1)
    return opt.m.numel() / p.numel()


def _model(dtype: str, zero1: bool = True) -> CostModel:
    cm = make_problem([chip("X", 8, 80.0, tp_max=1, net=NETWORK_GBS), chip("Y", 8, 80.0, tp_max=1, net=NETWORK_GBS)],
                      {"X": 1.0, "Y": 1.0}, layers=4, gb=8)
    return CostModel(cm.cluster, cm.model, replace(cm.train, dtype=dtype, zero1=zero1), cm.profile)


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("dp", [2, 4, 8])
@pytest.mark.parametrize("zero1", [True, False])
def test_a_stage_update_prices_the_gradient_all_reduce_and_weight_all_gather_the_engine_sends(
        dtype: str, dp: int, zero1: bool) -> None:
    grad_b, weight_b = _engine_bytes(dtype)
    cm = _model(dtype, zero1)
    params = cm.profile.layer_params  # one layer at TP 1 (no replicated key/value heads)
    bw = NETWORK_GBS * 1e9
    all_reduce = 2 * (dp - 1) / dp * params * grad_b / bw
    all_gather = (dp - 1) / dp * params * weight_b / bw if zero1 else 0.0
    optim = cm.profile.get("X", 1).optim_s * _engine_state_share(dp, zero1)  # the part each rank steps
    assert cm.coef("X", 1, False, dp).upd == pytest.approx(all_reduce + all_gather + optim, rel=1e-12)


@pytest.mark.parametrize("zero1", [False, True])
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("types", [("X",), ("X", "Y")])
def test_a_replica_group_part_prices_the_fp32_all_reduce_among_holders_then_its_zero1_gather(
        dtype: str, types: tuple[str, ...], zero1: bool) -> None:
    grad_b, weight_b = _engine_bytes(dtype)  # the holders' sum runs over the same fp32 gradient buffer
    cm = _model(dtype, zero1=zero1)
    params, ranks = cm.profile.layer_params, 4
    bw = NETWORK_GBS * 1e9
    all_reduce = 2 * (ranks - 1) / ranks * params * grad_b / bw
    all_gather = (ranks - 1) / ranks * params * weight_b / bw if zero1 else 0.0
    optim = cm.profile.get("X", 1).optim_s * _engine_state_share(ranks, zero1)  # each holder's share of the part
    got = cm.part_update(0, frozenset(types), "X", 1, ranks)
    assert got == pytest.approx(all_reduce + all_gather + optim, rel=1e-12)
