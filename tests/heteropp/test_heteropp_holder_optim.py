"""The optimizer of a rank of replica groups under ZeRO-1 (engine/holder_optim.py) is one ZeroAdamW per part the
rank holds, stepped together: in one process (every part held by this rank alone), against torch: the global
norm spans every part (torch's clip_grad_norm_ over all of them, then torch.optim.AdamW on the clipped
gradients), and fp16's overflow in any one part skips every part's step and halves the one loss scale."""
from __future__ import annotations

import pytest
import torch

from heteropp.engine.holder_optim import HolderAdamW
from heteropp.engine.optim import LossScaler
from heteropp.engine.replica_groups import HolderGroups, part_of

SHAPES = {"embed.weight": (16, 8), "layers.0.attn.weight": (8, 8), "layers.0.norm.weight": (8,),
          "layers.1.mlp.weight": (12, 8), "norm.weight": (8,), "head.weight": (16, 8)}
CLIP = 0.05  # below the random gradients' norm: every step clips


def _holder_adamw(params: list[torch.nn.Parameter], **kw) -> HolderAdamW:
    names = list(SHAPES)
    hg = HolderGroups(0, 0, 1, parts={part_of(n): None for n in names})
    return HolderAdamW(params, names, hg, 1e-2, weight_decay=0.1, decay=[p.ndim > 1 for p in params],
                       owned=[True] * len(params), distributed_norm=False, **kw)


def test_the_parts_clip_by_one_global_norm_and_step_as_torchs_adamw() -> None:
    torch.manual_seed(0)
    ours = [torch.nn.Parameter(torch.randn(s)) for s in SHAPES.values()]
    ref = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    opt = _holder_adamw(ours, clip_norm=CLIP, scaler=None)
    assert len(opt.parts) == 4  # the embedding, layers 0 and 1, the final norm with the head
    groups = [{"params": [p for p in ref if p.ndim > 1], "weight_decay": 0.1},
              {"params": [p for p in ref if p.ndim == 1], "weight_decay": 0.0}]
    torch_opt = torch.optim.AdamW(groups, 1e-2, betas=(0.9, 0.95), eps=1e-8, foreach=False)
    for _ in range(3):
        grads = [torch.randn(s) for s in SHAPES.values()]
        for a, b, g in zip(ours, ref, grads):
            a.grad, b.grad = g.clone(), g.clone()
        assert opt.step()
        norm = torch.nn.utils.clip_grad_norm_(ref, CLIP)
        assert norm > CLIP and opt.last_norm == pytest.approx(norm.item(), rel=1e-6)
        torch_opt.step()
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-6, atol=1e-7)
    state = opt.full_state()  # in the parameters' order, whatever part each is stepped in
    for i, p in enumerate(ref):
        torch.testing.assert_close(state["exp_avg"][i], torch_opt.state[p]["exp_avg"], rtol=1e-6, atol=1e-9)


def test_an_overflow_in_one_part_skips_every_parts_step() -> None:
    ours = [torch.nn.Parameter(torch.ones(s, dtype=torch.float16)) for s in SHAPES.values()]
    scaler = LossScaler(scale=1024.0)
    opt = _holder_adamw(ours, clip_norm=None, scaler=scaler)
    for name, p in zip(SHAPES, ours):
        p.grad = torch.full(p.shape, float("inf") if name == "layers.1.mlp.weight" else 512.0, dtype=torch.float16)
    assert not opt.step()
    assert all(torch.equal(p.detach(), torch.ones_like(p)) for p in ours) and opt.t == 0
    assert (scaler.scale, scaler.skipped) == (512.0, 1)
    for p in ours:
        p.grad = torch.full(p.shape, 512.0, dtype=torch.float16)  # the loss was scaled by 512: unscaled 1.0
    assert opt.step() and opt.t == 1 and scaler.scale == 512.0
    for o in opt.parts:  # every part's first moment from the unscaled gradient
        torch.testing.assert_close(o.m, torch.full_like(o.m, 0.1), rtol=1e-6, atol=0)


def test_a_part_the_holder_groups_do_not_list_is_refused_not_stepped_alone() -> None:
    names = list(SHAPES)
    params = [torch.nn.Parameter(torch.zeros(s)) for s in SHAPES.values()]
    hg = HolderGroups(0, 0, 1, parts={part_of(n): None for n in names if part_of(n) != 1})
    with pytest.raises(ValueError, match=r"\['layers.1.mlp.weight'\] are of part 1, which this rank's holder groups"):
        HolderAdamW(params, names, hg, 1e-2, weight_decay=0.1, decay=[True] * len(params),
                    owned=[True] * len(params), clip_norm=None, distributed_norm=False, scaler=None)
