"""Deliberately wrong kernels, to show that the tools find them: an ATen CPU kernel overridden
through torch.library for one dtype, restored on exit; optionally only while one module runs."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

import torch

# Honest math for the ops we know how to plant, written with other ops (calling the op itself
# from its own override would recurse).
_FORMULAS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": lambda x: x * torch.sigmoid(x),
    "rsqrt": lambda x: torch.reciprocal(torch.sqrt(x)),
    "sqrt": lambda x: torch.pow(x, 0.5),  # Adam's denominator (the for-loop step CPUs take)
    "mm": lambda a, b: torch.bmm(a.unsqueeze(0), b.unsqueeze(0)).squeeze(0),
    "bmm": lambda a, b: (a.unsqueeze(-1) * b.unsqueeze(-3)).sum(-2),
    # GPT-2's Conv1D and every nn.Linear with a bias (its first argument is the bias)
    "addmm": lambda bias, a, b, beta=1, alpha=1: beta * bias + alpha * torch.bmm(a.unsqueeze(0),
                                                                                b.unsqueeze(0)).squeeze(0),
    # BERT's and GPT-2's activation (erf, or its tanh approximation)
    "gelu": lambda x, approximate="none": (0.5 * x * (1 + torch.erf(x * 0.7071067811865476))) if approximate == "none"
    else 0.5 * x * (1 + torch.tanh(0.7978845608028654 * (x + 0.044715 * x ** 3))),
}


@contextmanager
def wrong_kernel(op: str = "silu", scale: float = 1.0 + 1e-3, dtype: torch.dtype = torch.float32,
                 inside: torch.nn.Module | None = None) -> Iterator[None]:
    """Within the block, ``aten::<op>`` on CPU returns ``scale`` x the right value for ``dtype``
    inputs (other dtypes, such as a float64 reference, stay right). With ``inside``: only while that
    module's forward runs (its calls elsewhere, and replays outside the model, stay right)."""
    if op not in _FORMULAS:
        raise ValueError(f"no honest formula for aten::{op}; known: {', '.join(_FORMULAS)}")
    formula = _FORMULAS[op]
    active = [inside is None]
    hooks = []
    if inside is not None:
        hooks = [inside.register_forward_pre_hook(lambda *_: active.__setitem__(0, True)),
                 inside.register_forward_hook(lambda *_: active.__setitem__(0, False))]

    def kernel(x: torch.Tensor, *rest: torch.Tensor, **options: str) -> torch.Tensor:
        y = formula(x, *rest, **options)
        return y * scale if x.dtype == dtype and active[0] else y

    lib = torch.library.Library("aten", "IMPL")
    try:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "overriding a previously registered kernel" is the point
            lib.impl(op, kernel, "CPU")
        yield
    finally:
        lib._destroy()
        for h in hooks:
            h.remove()


@contextmanager
def wrong_draws(keep_scale: float, inside: torch.nn.Module) -> Iterator[None]:
    """Within the block, ``aten::bernoulli_`` with a float probability (dropout's keep mask on the
    CPU) draws on CPU with ``keep_scale`` x that probability while ``inside``'s forward runs, and
    honestly elsewhere (from uniform draws: the override cannot call the op it replaces)."""
    active = [False]
    hooks = [inside.register_forward_pre_hook(lambda *_: active.__setitem__(0, True)),
             inside.register_forward_hook(lambda *_: active.__setitem__(0, False))]

    def kernel(self: torch.Tensor, p: float = 0.5, *, generator=None) -> torch.Tensor:
        keep = min(p * keep_scale, 1.0) if active[0] else p
        return self.copy_(torch.rand(self.shape, generator=generator) < keep)

    lib = torch.library.Library("aten", "IMPL")
    try:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            lib.impl("bernoulli_.float", kernel, "CPU")
        yield
    finally:
        lib._destroy()
        for h in hooks:
            h.remove()


@contextmanager
def device_only_kernel(error: float = 1.0) -> Iterator[Callable[[torch.Tensor, float], torch.Tensor]]:
    """A kernel only the device's torch has (as a vendor's fused op): within the block the op
    ``precision_faults::scale(x, s)`` exists (forward x * s, times ``error`` as a faulty kernel
    would; backward grad * s) and the block gets it; at exit it is gone, so a torch that compares a
    capture afterwards does not know it and cannot replay it."""
    lib = torch.library.Library("precision_faults", "DEF")
    try:
        lib.define("scale(Tensor x, float s) -> Tensor")
        lib.impl("scale", lambda x, s: x * (s * error), "CPU")

        def setup(ctx, inputs, output) -> None:
            ctx.s = inputs[1]

        torch.library.register_autograd("precision_faults::scale", lambda ctx, grad: (grad * ctx.s, None),
                                        setup_context=setup, lib=lib)
        yield torch.ops.precision_faults.scale.default
    finally:
        lib._destroy()


@contextmanager
def device_only_random_kernel() -> Iterator[Callable[[torch.Tensor, float], torch.Tensor]]:
    """A random kernel only the device's torch has (as a vendor's fused dropout): within the block
    the op ``precision_faults::jitter(x, s)`` (x plus uniform noise in [-s/2, s/2] from the default
    generator, tagged as drawing random numbers) exists and the block gets it; at exit it is gone."""
    lib = torch.library.Library("precision_faults", "DEF")
    try:
        lib.define("jitter(Tensor x, float s) -> Tensor", tags=(torch.Tag.nondeterministic_seeded,))
        lib.impl("jitter", lambda x, s: x + (torch.rand(x.shape, dtype=x.dtype) - 0.5) * s, "CPU")
        yield torch.ops.precision_faults.jitter.default
    finally:
        lib._destroy()
