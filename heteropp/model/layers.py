"""Decoder layer: RMSNorm, rotary embeddings, grouped-query attention and SwiGLU, sharded over a TP group."""
from __future__ import annotations

import math

import torch
from torch import nn

from ..spec import ModelSpec
from .init import full_init
from .linear import ColumnParallelLinear, RowParallelLinear
from .parallel import TPGroup, copy_to_tp


class RMSNorm(nn.Module):
    """Normalised in fp32 whatever the activations' dtype, then scaled in theirs (as transformers' LLaMA)."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(full_init(0, 0, "", (dim,), None))
        self.weight.shard_dim = None  # type: ignore[attr-defined]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


def rotary(x: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    """Rotate pairs (first half, second half) of each head by a position-dependent angle. x: [b, h, s, d].
    Angles in fp32, applied in x's dtype."""
    s, d = x.shape[-2], x.shape[-1]
    freqs = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.int64, device=x.device).float() / d)
    angles = torch.outer(torch.arange(s, dtype=torch.float32, device=x.device), freqs)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class Attention(nn.Module):
    """Heads (query and key/value) are split over TP: column-parallel q, k, v and row-parallel output.

    With more TP ranks than key/value heads, each rank keeps the one key/value head its query heads use
    (Megatron's replication): tp // kv_heads consecutive ranks hold the same head, and their partial weight
    gradients are summed after the backward pass (sync_replicated_grads)."""

    def __init__(self, m: ModelSpec, tp: TPGroup, seed: int, layer: int) -> None:
        super().__init__()
        self.tp, self.hd, self.theta = tp, m.head_dim, m.rope_theta
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
        q, k = rotary(q, self.theta), rotary(k, self.theta)
        rep = self.heads // self.kv_heads  # each local kv head serves `rep` local query heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(b, s, self.heads * self.hd))


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
        return self.down(nn.functional.silu(self.gate(x, copied=True)) * self.up(x, copied=True))


class Block(nn.Module):
    def __init__(self, m: ModelSpec, tp: TPGroup, seed: int, layer: int) -> None:
        super().__init__()
        self.attn_norm, self.ffn_norm = RMSNorm(m.hidden, m.norm_eps), RMSNorm(m.hidden, m.norm_eps)
        self.attn = Attention(m, tp, seed, layer)
        self.ffn = FeedForward(m, tp, seed, layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.ffn(self.ffn_norm(x))
