"""The engine's AdamW (ZeroAdamW at dp 1) against torch.optim.AdamW, step by step: the same update rule,
weight decay and bias correction, and its state carried across steps in its persistent buffers."""
from __future__ import annotations

import pytest
import torch

from heteropp.engine.optim import ZeroAdamW


@pytest.mark.parametrize("wd", [0.0, 0.01])
def test_steps_match_torch_adamw(wd: float) -> None:
    torch.manual_seed(0)
    shapes = [(37, 5), (11,), (64, 64), (1,)]
    ours = [torch.nn.Parameter(torch.randn(s, dtype=torch.float64)) for s in shapes]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    start = [p.detach().clone() for p in ours]
    opt = ZeroAdamW(ours, 3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=wd)
    ref = torch.optim.AdamW(theirs, 3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=wd)
    for step in range(6):
        grads = [torch.randn(s, dtype=torch.float64) * (step + 1) for s in shapes]
        for a, b, g in zip(ours, theirs, grads):
            a.grad, b.grad = g.clone(), g.clone()
        opt.step()
        ref.step()
        for a, b in zip(ours, theirs):
            # torch divides sqrt(v) by sqrt(1 - b2^t), we take sqrt(v / (1 - b2^t)): rounding apart only
            torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-12, atol=1e-14)
    assert all((a.detach() - s).abs().max() > 1e-3 for a, s in zip(ours, start))  # they did move


def test_a_parameter_without_gradient_is_named() -> None:
    ps = [torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2))]
    ps[0].grad = torch.ones(3)
    with pytest.raises(RuntimeError, match=r"parameters \[1\] got no gradient"):
        ZeroAdamW(ps, 1e-3).step()


def test_parameters_of_two_dtypes_are_refused() -> None:
    ps = [torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))]
    with pytest.raises(ValueError, match="one dtype: got torch.float32 and torch.float64"):
        ZeroAdamW(ps, 1e-3)
