"""Single-process checks of the pieces: deferred weight gradients, vocab-parallel cross-entropy, the
resharding piece map for every TP pair among 1, 2, 4, deterministic init, and schedule validation.
The references are plain torch (nn.functional) math."""
from __future__ import annotations

import itertools

import pytest
import torch

from heteropp.engine.reshard import Boundary
from heteropp.engine.schedule import compile_schedule
from heteropp.model import ColumnParallelLinear, RowParallelLinear, StageModel, TPGroup, WeightGradStore
from heteropp.model.init import full_init, shard
from heteropp.model.vocab import vocab_parallel_cross_entropy
from heteropp.schedules import ScheduleError
from tests.heteropp.heteropp_helpers import MODEL, plan


@pytest.mark.parametrize("cls", [ColumnParallelLinear, RowParallelLinear])
def test_linear_gradients_now_and_deferred_match_torch(cls) -> None:
    lin = cls(8, 6, TPGroup(), seed=1, layer=0, name="w", std=0.1)
    x = torch.randn(3, 5, 8, requires_grad=True)
    ref_w = lin.weight.detach().clone().requires_grad_()
    torch.nn.functional.linear(x, ref_w).square().sum().backward()
    want_x, want_w = x.grad.clone(), ref_w.grad
    x.grad = None
    with WeightGradStore() as store:
        lin(x).square().sum().backward()
    assert lin.weight.grad is None and len(store.queue) == 1, "weight gradient should wait for the W pass"
    torch.testing.assert_close(x.grad, want_x)
    store.flush()
    torch.testing.assert_close(lin.weight.grad, want_w)
    # a plain tensor: a recorded graph would hold the saved activations until the gradients are cleared
    assert not lin.weight.grad.requires_grad


def test_vocab_parallel_cross_entropy_matches_torch() -> None:
    logits = torch.randn(2, 7, 11, requires_grad=True)
    target = torch.randint(0, 11, (2, 7))
    ref = logits.detach().clone().requires_grad_()
    want = torch.nn.functional.cross_entropy(ref.reshape(-1, 11), target.reshape(-1))
    want.backward()
    got = vocab_parallel_cross_entropy(logits, target, TPGroup())
    got.backward()
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(logits.grad, ref.grad)


@pytest.mark.parametrize("send,recv", list(itertools.product((1, 2, 4), repeat=2)))
def test_resharding_moves_every_piece_once_and_rebuilds(send: int, recv: int) -> None:
    b = Boundary(send, recv)
    sent = sorted(k for i in range(send) for _, k in b.outgoing(i))
    got = sorted(k for j in range(recv) for _, k in b.incoming(j))
    assert sent == got == list(range(b.pieces)), "each piece must cross exactly once"
    for i in range(send):
        assert all(j % recv == k % recv and k % send == i for j, k in b.outgoing(i))
    x = torch.randn(2, 5, 3)  # 30 elements: not a multiple of 4, so padding is exercised
    pieces = b.split(x)
    held = {j: [pieces[k] for _, k in b.incoming(j)] for j in range(recv)}
    # What the all-gather in the receiving group would deliver, then each receiver's reassembly order.
    order = [None] * b.pieces
    for j, mine in held.items():
        for n, p in enumerate(mine):
            order[j + n * recv] = p
    torch.testing.assert_close(torch.cat(order)[: x.numel()].view_as(x), x)
    if recv == 1:
        torch.testing.assert_close(b.assemble(held[0], 0, TPGroup(), x.shape), x)


def test_init_depends_only_on_seed_layer_and_name() -> None:
    a = full_init(3, 5, "attn.wq", (4, 4), 0.02)
    torch.testing.assert_close(a, full_init(3, 5, "attn.wq", (4, 4), 0.02))
    assert not torch.equal(a, full_init(3, 6, "attn.wq", (4, 4), 0.02))
    torch.testing.assert_close(torch.cat([shard(a, 0, r, 2) for r in range(2)]), a)
    whole = StageModel(MODEL, range(4), TPGroup(), seed=0, first=True, last=True)
    part = StageModel(MODEL, range(2, 3), TPGroup(), seed=0, first=False, last=False)
    torch.testing.assert_close(part.layers["2"].ffn.up.weight, whole.layers["2"].ffn.up.weight)


@pytest.mark.parametrize("actions,error", [
    ([["B0", "F0", "F1", "B1"], ["F0", "B0", "F1", "B1"]], "before its forward"),
    ([["F0", "F1", "I0", "I1", "W0"], ["F0", "I0", "W0", "F1", "I1", "W1"]], "needs either B1 or both I1 and W1"),
    ([["F0", "B0", "F1", "B1"], ["F1", "F0", "B0", "B1"]], "deadlock"),
    ([["F0", "X1"], ["F0"]], "cannot parse"),
    ([["F0", "F1", "B0", "B1"]], "the plan has 2"),
])
def test_malformed_action_lists_are_rejected_before_running(actions, error) -> None:
    p = plan([(1, 2, False), (1, 2, False)], micro_batches=2)
    with pytest.raises(ScheduleError, match=error):
        compile_schedule(p, actions)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_norm_and_swiglu_gradients_equal_autograds_of_the_plain_formulas(dtype: torch.dtype) -> None:
    """The layer's RMSNorm and SwiGLU keep less for backward than autograd's graph of the same operations
    would; their gradients are still those of the plain formulas, by autograd, within rounding (the norm
    normalises in fp32 whatever the input's dtype, as transformers' LLaMA does; SwiGLU bit for bit)."""
    from heteropp.model.layers import RMSNorm, _SwiGLU

    torch.manual_seed(0)
    x = torch.randn(3, 5, 16, dtype=dtype, requires_grad=True)
    norm = RMSNorm(16, eps=1e-5).to(dtype)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    g = torch.randn(3, 5, 16, dtype=dtype)

    def plain_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        h = x.float()
        return w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5)).to(x.dtype)

    got = torch.autograd.grad(norm(x), (x, norm.weight), g)
    want = torch.autograd.grad(plain_norm(x, norm.weight), (x, norm.weight), g)
    tol = {torch.float64: 1e-6, torch.float32: 1e-5, torch.bfloat16: 2e-2}[dtype]
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)
    gate, up = torch.randn(4, 24, dtype=dtype, requires_grad=True), torch.randn(4, 24, dtype=dtype, requires_grad=True)
    h = torch.randn(4, 24, dtype=dtype)
    got = torch.autograd.grad(_SwiGLU.apply(gate, up), (gate, up), h)
    want = torch.autograd.grad(torch.nn.functional.silu(gate) * up, (gate, up), h)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)  # the same operations in the same order
    if dtype == torch.float64:
        assert torch.autograd.gradcheck(_SwiGLU.apply, (gate, up))


def test_a_linear_takes_heads_as_its_input_features_only_from_a_4d_view() -> None:
    """The output projection may take the attention's output as [b, s, heads, head_dim] (its last two dims are
    the input features) and then equals nn.functional.linear of the flattened rows; an input whose last dim is
    simply wrong is an error, never silently re-read as another shape."""
    lin = RowParallelLinear(8, 3, TPGroup(rank=0, size=1), seed=0, layer=0, name="attn.wo", std=0.02)
    heads = torch.randn(2, 5, 4, 2, requires_grad=True)
    torch.testing.assert_close(lin(heads), torch.nn.functional.linear(heads.detach().reshape(2, 5, 8), lin.weight))
    lin(heads).sum().backward()
    assert heads.grad is not None and heads.grad.shape == heads.shape
    with pytest.raises(RuntimeError):
        lin(torch.randn(2, 2, 4))  # 2 x 4 = 8 features, but a 3-d input whose last dim is 4: a wrong shape
