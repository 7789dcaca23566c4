"""Gradient clipping by global norm across stages, TP ranks (replicated parameters counted once) and DP
shards: the norm of every step equals torch's clip_grad_norm_ on the single-process model, and the clipped
training follows the reference's losses."""
from __future__ import annotations

import functools

import pytest
import torch

from heteropp.engine import RunConfig, launch, train_reference
from heteropp.engine.data import global_batch
from heteropp.engine.optim import ZeroAdamW
from heteropp.model import StageModel, TPGroup
from tests.heteropp.heteropp_helpers import MODEL, PLANS, RTOL, check_losses, losses

CLIP = 0.05  # well below this model's gradient norm (~0.5-1), so every step clips
STEPS = 3


def test_reference_norm_and_clipping_equal_torchs() -> None:
    """Independent check of the optimizer's norm and coefficient: torch.nn.utils.clip_grad_norm_."""
    model = StageModel(MODEL, range(MODEL.layers), TPGroup(), seed=0, first=True, last=True)
    batch = global_batch(MODEL, 0, 1, 4)
    model.loss(model(batch[:, :-1]), batch[:, 1:]).backward()
    grads = [p.grad.clone() for p in model.parameters()]
    norm = torch.nn.utils.clip_grad_norm_(list(model.parameters()), CLIP)
    clipped = [p.grad.clone() for p in model.parameters()]
    for p, g in zip(model.parameters(), grads):
        p.grad = g
    before = [p.detach().clone() for p in model.parameters()]
    opt = ZeroAdamW(list(model.parameters()), 1e-3, clip_norm=CLIP, weight_decay=0.0)
    opt.step()
    assert opt.last_norm == pytest.approx(norm.item(), rel=1e-6)
    # the same step from the same weights, fed torch's clipped gradients and no clipping of its own
    after = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        for p, b in zip(model.parameters(), before):
            p.copy_(b)
    for p, g in zip(model.parameters(), clipped):
        p.grad = g
    ZeroAdamW(list(model.parameters()), 1e-3, weight_decay=0.0).step()
    for p, a in zip(model.parameters(), after):
        assert torch.allclose(p.detach(), a, rtol=1e-6, atol=1e-9)


@functools.lru_cache(maxsize=None)
def run(name: str) -> dict:
    cfg = RunConfig(plan=PLANS[name].to_dict(), model=RunConfig.model_dict(MODEL), steps=STEPS, schedules=["1f1b"],
                    backend="gloo", chip_map={"A": "cpu", "B": "cpu"}, timeout_s=60, clip_grad=CLIP)
    return launch(cfg)


@pytest.mark.parametrize("name", ["dp2-tp2-1", "tp1-2-4-1"])
def test_clipped_pipeline_matches_clipped_reference(name: str) -> None:
    want = train_reference(MODEL, STEPS, PLANS[name].global_batch, verbose=False, clip_grad=CLIP)
    res = run(name)
    assert all(n > CLIP for n in want["grad_norms"]), "the test must clip"
    assert len(want["grad_norms"]) == STEPS
    for r in res.values():  # every rank computed the same global norm, equal to the reference's
        assert r["1f1b"]["grad_norms"] == pytest.approx(want["grad_norms"], rel=RTOL)
    check_losses(losses(res, "1f1b"), want["losses"], name)
