"""A LLaMA-style decoder small enough to train a few steps on a CPU: RMSNorm, rotary attention,
SwiGLU MLP, tied nothing, cross-entropy loss."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class LlamaConfig:
    vocab: int = 128
    dim: int = 64
    layers: int = 2
    heads: int = 4
    hidden: int = 128
    seq: int = 16
    batch: int = 4


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotary(x: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding over (batch, heads, seq, head_dim)."""
    seq, half = x.shape[-2], x.shape[-1] // 2
    freqs = 1.0 / (10000 ** (torch.arange(half, dtype=torch.float32, device=x.device) / half))
    angles = torch.outer(torch.arange(seq, dtype=torch.float32, device=x.device), freqs)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.wq = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.wo = nn.Linear(cfg.dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = (w(x).view(b, s, self.heads, -1).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        q, k = rotary(q), rotary(k)
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        mask = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
        att = scores.masked_fill(mask, float("-inf")).softmax(-1)
        return self.wo((att @ v).transpose(1, 2).reshape(b, s, d))


class MLP(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.hidden, bias=False)
        self.w3 = nn.Linear(cfg.dim, cfg.hidden, bias=False)
        self.w2 = nn.Linear(cfg.hidden, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.attn_norm, self.attn = RMSNorm(cfg.dim), Attention(cfg)
        self.mlp_norm, self.mlp = RMSNorm(cfg.dim), MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class TinyLlama(nn.Module):
    def __init__(self, cfg: LlamaConfig | None = None) -> None:
        super().__init__()
        self.cfg = cfg = cfg or LlamaConfig()
        self.embed = nn.Embedding(cfg.vocab, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, cfg.vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def batches(cfg: LlamaConfig, steps: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Fixed token batches: inputs and next-token targets."""
    g = torch.Generator().manual_seed(seed)
    data = torch.randint(0, cfg.vocab, (steps, cfg.batch, cfg.seq + 1), generator=g)
    return [(d[:, :-1], d[:, 1:]) for d in data]


def make_model(cfg: LlamaConfig | None = None, seed: int = 0, dtype: torch.dtype = torch.float32) -> TinyLlama:
    torch.manual_seed(seed)
    return TinyLlama(cfg).to(dtype)


def train_step(model: TinyLlama, opt: torch.optim.Optimizer, tokens: torch.Tensor, targets: torch.Tensor) -> float:
    logits = model(tokens)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return float(loss.detach())


def train(steps: int = 3, cfg: LlamaConfig | None = None, seed: int = 0, dtype: torch.dtype = torch.float32,
          lr: float = 1e-2, optimizer: str = "adamw") -> list[float]:
    """Train a fresh model ``steps`` steps with AdamW (or plain SGD, fewer ops); returns the losses."""
    cfg = cfg or LlamaConfig()
    model = make_model(cfg, seed, dtype)
    if optimizer == "sgd":
        opt: torch.optim.Optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=lr, foreach=False)
    return [train_step(model, opt, x, y) for x, y in batches(cfg, steps, seed)]
