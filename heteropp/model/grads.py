"""Where a parameter's gradient accumulates: its `main_grad`, a view of the optimizer's one flat gradient
buffer (Megatron's main_grad), so a stage holds its gradients once.

With fp32 parameters `main_grad` is also `p.grad`, and autograd adds into it in place. With bf16 or fp16
parameters it is fp32: each backward's low-precision gradient is added into it as soon as autograd has it
and then freed, so gradients accumulate over the micro-batches in fp32 whatever the parameters' dtype.
Parameters without a `main_grad` (no ZeroAdamW bound to them) keep torch's plain `p.grad`.

The weight gradients the model computes itself go into `main_grad` without a temporary of the weight's size
where they can (a linear layer's in one addmm, an embedding's by an accumulating index_put): on the vocabulary-sized
matrices such a temporary was the step's largest allocation beyond the state."""
from __future__ import annotations

import torch


def grad_of(p: torch.Tensor) -> torch.Tensor | None:
    """The gradient accumulated so far: `main_grad` when an optimizer bound one, else `p.grad`."""
    main = getattr(p, "main_grad", None)
    return main if main is not None else p.grad


_CHUNK = 1 << 20  # elements of the low-precision temporary when a weight gradient is added in pieces


def accumulate_linear(p: torch.Tensor, g: torch.Tensor, x: torch.Tensor) -> None:
    """p's gradient += g^T x: a linear layer's weight gradient from its output gradient g and input x, both
    (tokens, features)."""
    main = getattr(p, "main_grad", None)
    if main is None:
        accumulate(p, g.t() @ x)
        return
    if main.dtype == g.dtype:
        main.addmm_(g.t(), x)
    else:  # bf16/fp16 into fp32: a few output rows at a time
        rows = max(1, _CHUNK // max(1, x.shape[1]))
        for a in range(0, main.shape[0], rows):
            main[a:a + rows].add_(g[:, a:a + rows].t() @ x)
    p.got_grad = True  # type: ignore[attr-defined]


def accumulate_rows(p: torch.Tensor, index: torch.Tensor, g: torch.Tensor) -> None:
    """p's gradient rows `index` += g (an embedding's weight gradient: one row of g per looked-up token)."""
    main = getattr(p, "main_grad", None)
    if main is None:
        accumulate(p, torch.zeros_like(p).index_put_((index,), g.to(p.dtype), accumulate=True))
        return
    # index_put_ with accumulate rather than index_add_: the same sums, and an operator DIOPI libraries have
    main.index_put_((index,), g.to(main.dtype), accumulate=True)
    p.got_grad = True  # type: ignore[attr-defined]


def accumulate(p: torch.Tensor, g: torch.Tensor) -> None:
    """Add `g` to p's gradient (for autograd functions that compute a weight gradient themselves)."""
    main = getattr(p, "main_grad", None)
    if main is not None:
        main.add_(g.view_as(main))
        p.got_grad = True  # type: ignore[attr-defined]
    else:
        p.grad = g if p.grad is None else p.grad + g
