"""Decoder layer: RMSNorm, rotary embeddings, grouped-query attention and SwiGLU, sharded over a TP group."""
from __future__ import annotations

import functools
import math

import torch
from torch import nn

from ..spec import ModelSpec
from .init import full_init
from .linear import ColumnParallelLinear, RowParallelLinear
from .parallel import TPGroup, copy_to_tp


class _RMSNorm(torch.autograd.Function):
    """weight * (x * rsqrt(mean(x^2) + eps)) with the normalisation in fp32, as transformers' LLaMA computes it,
    keeping for backward only the input and one fp32 scale per row (autograd's own graph of these operations
    keeps the input, the fp32 normalised rows and the output: 3 copies of the row where Megatron's accounting,
    and HeteroAuto's memory model, count 2 with the next layer's saved input)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        h = x.float()
        rstd = torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return weight * (h * rstd).to(x.dtype)

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        x, weight, rstd = ctx.saved_tensors
        h = x.float()
        n = h * rstd
        grad_w = (g * n.to(x.dtype)).reshape(-1, g.shape[-1]).sum(0) if ctx.needs_input_grad[1] else None
        gn = (g * weight).float()  # the gradient of the fp32 normalised rows
        # d/dh of h * (mean(h^2) + eps)^-1/2: rstd * (gn - n * mean(gn * n))
        grad_x = (rstd * (gn - n * (gn * n).mean(-1, keepdim=True))).to(x.dtype)
        return grad_x, grad_w, None


class RMSNorm(nn.Module):
    """Normalised in fp32 whatever the activations' dtype, then scaled in theirs (as transformers' LLaMA)."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(full_init(0, 0, "", (dim,), None))
        self.weight.shard_dim = None  # type: ignore[attr-defined]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _RMSNorm.apply(x, self.weight, self.eps)


def llama3_frequencies(freqs: torch.Tensor, scaling: tuple[float, float, float, int]) -> torch.Tensor:
    """Llama 3's rope scaling of the rotary frequencies: wavelengths longer than the original context over
    low_freq_factor are slowed by `factor`, shorter than it over high_freq_factor kept, and those between
    blended linearly in original context / wavelength (transformers' rope_type "llama3")."""
    factor, low, high, old = scaling
    wavelen = 2 * math.pi / freqs
    smooth = (old / wavelen - low) / (high - low)
    blended = (1 - smooth) * freqs / factor + smooth * freqs
    out = torch.where(wavelen > old / low, freqs / factor, freqs)
    return torch.where((wavelen <= old / low) & (wavelen >= old / high), blended, out)


@functools.lru_cache(maxsize=16)
def _angles(s: int, d: int, theta: float, dtype: torch.dtype, device: torch.device,
            scaling: tuple[float, float, float, int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary angles, computed once and shared by every layer (the multiplications keep
    them for backward: one pair for the model, not a pair per layer and per micro-batch). Made outside
    inference mode, so that a first call under it does not hand later training steps inference tensors."""
    with torch.inference_mode(False):
        freqs = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.int64, device=device).float() / d)
        if scaling is not None:
            freqs = llama3_frequencies(freqs, scaling)
        angles = torch.outer(torch.arange(s, dtype=torch.float32, device=device), freqs)
        return angles.cos().to(dtype), angles.sin().to(dtype)


def rotary(x: torch.Tensor, theta: float = 10000.0,
           scaling: tuple[float, float, float, int] | None = None) -> torch.Tensor:
    """Rotate pairs (first half, second half) of each head by a position-dependent angle. x: [b, h, s, d].
    Angles in fp32, applied in x's dtype; `scaling`: Llama 3's (ModelSpec.rope_scaling)."""
    s, d = x.shape[-2], x.shape[-1]
    cos, sin = _angles(s, d, float(theta), x.dtype, x.device, scaling)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class Attention(nn.Module):
    """Heads (query and key/value) are split over TP: column-parallel q, k, v and row-parallel output.

    With more TP ranks than key/value heads, each rank keeps the one key/value head its query heads use
    (Megatron's replication): tp // kv_heads consecutive ranks hold the same head, and their partial weight
    gradients are summed after the backward pass (sync_replicated_grads)."""

    def __init__(self, m: ModelSpec, tp: TPGroup, seed: int, layer: int) -> None:
        super().__init__()
        self.tp, self.hd, self.theta, self.rope_scaling = tp, m.head_dim, m.rope_theta, m.rope_scaling
        kv_replicas = max(1, tp.size // m.kv_heads)
        self.heads, self.kv_heads = m.heads // tp.size, m.kv_heads * kv_replicas // tp.size
        kv = m.kv_heads * m.head_dim
        out_std = 0.02 / math.sqrt(2 * m.layers)
        b = m.qkv_bias
        self.wq = ColumnParallelLinear(m.hidden, m.q_dim, tp, seed=seed, layer=layer, name="attn.wq", std=0.02, bias=b)
        self.wk = ColumnParallelLinear(m.hidden, kv, tp, seed=seed, layer=layer, name="attn.wk", std=0.02,
                                       replicas=kv_replicas, bias=b)
        self.wv = ColumnParallelLinear(m.hidden, kv, tp, seed=seed, layer=layer, name="attn.wv", std=0.02,
                                       replicas=kv_replicas, bias=b)
        self.wo = RowParallelLinear(m.q_dim, m.hidden, tp, seed=seed, layer=layer, name="attn.wo", std=out_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        x = copy_to_tp(x, self.tp)  # one gradient all-reduce for q, k and v together
        q = self.wq(x, copied=True).view(b, s, self.heads, self.hd).transpose(1, 2)
        k = self.wk(x, copied=True).view(b, s, self.kv_heads, self.hd).transpose(1, 2)
        v = self.wv(x, copied=True).view(b, s, self.kv_heads, self.hd).transpose(1, 2)
        q, k = rotary(q, self.theta, self.rope_scaling), rotary(k, self.theta, self.rope_scaling)
        # each local kv head serves heads // kv_heads local query heads; the kernel reads them in place
        # (expanding k and v first would keep expanded copies for backward)
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                       enable_gqa=self.heads != self.kv_heads)
        # [b, s, heads, hd] as a view of the attention's output, which the attention keeps for backward
        # anyway: the projection keeps the same storage instead of a reshaped copy
        return self.wo(y.transpose(1, 2))


class _SwiGLU(torch.autograd.Function):
    """silu(gate) * up keeping only gate and up for backward (silu is recomputed there); autograd's own graph
    of the two operations also keeps silu(gate), a third tensor of the feed-forward width."""

    @staticmethod
    def forward(ctx, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(gate, up)
        return nn.functional.silu(gate) * up

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        gate, up = ctx.saved_tensors
        # the operations autograd runs for silu(gate) * up, in the same order (the same rounding)
        return torch.ops.aten.silu_backward(g * up, gate), g * nn.functional.silu(gate)


class FeedForward(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)); gate/up column-parallel, down row-parallel."""

    def __init__(self, m: ModelSpec, tp: TPGroup, seed: int, layer: int) -> None:
        super().__init__()
        self.tp = tp
        out_std = 0.02 / math.sqrt(2 * m.layers)
        self.gate = ColumnParallelLinear(m.hidden, m.ffn, tp, seed=seed, layer=layer, name="ffn.gate", std=0.02)
        self.up = ColumnParallelLinear(m.hidden, m.ffn, tp, seed=seed, layer=layer, name="ffn.up", std=0.02)
        self.down = RowParallelLinear(m.ffn, m.hidden, tp, seed=seed, layer=layer, name="ffn.down", std=out_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = copy_to_tp(x, self.tp)
        return self.down(_SwiGLU.apply(self.gate(x, copied=True), self.up(x, copied=True)))


class Block(nn.Module):
    def __init__(self, m: ModelSpec, tp: TPGroup, seed: int, layer: int) -> None:
        super().__init__()
        self.attn_norm, self.ffn_norm = RMSNorm(m.hidden, m.norm_eps), RMSNorm(m.hidden, m.norm_eps)
        self.attn = Attention(m, tp, seed, layer)
        self.ffn = FeedForward(m, tp, seed, layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.ffn(self.ffn_norm(x))
