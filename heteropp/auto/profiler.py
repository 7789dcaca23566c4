"""Auto-profiler: time a real LLaMA-style layer shard with torch on this machine.

One rank's shard of a TP group is emulated by dividing heads, KV heads and the FFN width by tp (TP
communication is not measured here). The embedding and head cost cancel by profiling two depths:
t_layer = (t(d2) - t(d1)) / (d2 - d1), t_ends = t(d1) - d1 * t_layer. Saved activations are counted
with saved-tensor hooks.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..spec import load_model
from .profiles import ChipProfile, Profile, TPProfile


class _Layer(nn.Module):
    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, ffn: int) -> None:
        super().__init__()
        self.h, self.kv, self.d = heads, kv_heads, head_dim
        self.norm1, self.norm2 = nn.RMSNorm(hidden), nn.RMSNorm(hidden)
        self.qkv = nn.Linear(hidden, (heads + 2 * kv_heads) * head_dim, bias=False)
        self.o = nn.Linear(heads * head_dim, hidden, bias=False)
        self.gate_up = nn.Linear(hidden, 2 * ffn, bias=False)
        self.down = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).split([self.h * self.d, self.kv * self.d, self.kv * self.d], -1)
        q = q.view(b, s, self.h, self.d).transpose(1, 2)
        k = k.view(b, s, self.kv, self.d).transpose(1, 2).repeat_interleave(self.h // self.kv, 1)
        v = v.view(b, s, self.kv, self.d).transpose(1, 2).repeat_interleave(self.h // self.kv, 1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, -1)
        x = x + self.o(a)
        g, u = self.gate_up(self.norm2(x)).chunk(2, -1)
        return x + self.down(F.silu(g) * u)


class _Net(nn.Module):
    def __init__(self, m, tp: int, depth: int, recompute: bool) -> None:
        super().__init__()
        self.emb = nn.Embedding(m.vocab, m.hidden)
        self.layers = nn.ModuleList(_Layer(m.hidden, m.heads // tp, max(1, m.kv_heads // tp), m.head_dim, m.ffn // tp)
                                    for _ in range(depth))
        self.norm, self.head = nn.RMSNorm(m.hidden), nn.Linear(m.hidden, m.vocab // tp, bias=False)
        self.recompute = recompute

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.emb(tokens)
        for layer in self.layers:
            x = torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=False) if self.recompute else layer(x)
        return self.head(self.norm(x)).float().logsumexp(-1).mean()


def _resolve_device(name: str) -> torch.device:
    if name == "device":
        try:  # the unified device name of ditorch, when it provides one
            import ditorch
            return torch.device(getattr(ditorch, "device_type", lambda: "cpu")())
        except Exception:
            return torch.device("cpu")
    return torch.device(name)


def _time(net: _Net, tokens: torch.Tensor, repeats: int) -> tuple[float, float, float]:
    """Median forward time, backward time, and bytes saved for backward."""
    saved = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[0] += t.numel() * t.element_size()
        return t

    fw, bw = [], []
    for i in range(repeats + 1):
        saved[0] = 0
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            t0 = time.perf_counter()
            loss = net(tokens)
            t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        if i:  # the first run warms up allocators and kernels
            fw.append(t1 - t0), bw.append(t2 - t1)
    return statistics.median(fw), statistics.median(bw), float(saved[0])


def profile_model(model: str, tps: list[int], device: str = "cpu", chip: str = "cpu", seq_len: int | None = None,
                  micro_batch_size: int = 1, repeats: int = 3, depths: tuple[int, int] = (1, 3),
                  progress: Callable[[str], None] | None = None) -> Profile:
    m = load_model(model)
    if seq_len:
        from dataclasses import replace
        m = replace(m, seq_len=seq_len)
    dev = _resolve_device(device)
    torch.manual_seed(0)
    entries = {}
    d1, d2 = depths
    for tp in tps:
        if m.heads % tp or m.kv_heads % tp and tp > m.kv_heads:
            raise ValueError(f"tp={tp} does not divide the model's {m.heads} heads")
        tokens = torch.randint(0, m.vocab, (micro_batch_size, m.seq_len), device=dev)
        res = {}
        for rc in (False, True):
            for d in (d1, d2):
                if progress:
                    progress(f"profiling tp={tp} depth={d} recompute={'on' if rc else 'off'} on {dev}")
                res[(rc, d)] = _time(_Net(m, tp, d, rc).to(dev), tokens, repeats)
        per = lambda rc, i: max((res[(rc, d2)][i] - res[(rc, d1)][i]) / (d2 - d1), 0.0)  # noqa: E731
        fwd, bwd, act = per(False, 0), per(False, 1), per(False, 2)
        bwd_rc, ckpt = per(True, 1), per(True, 2)
        ends = max(sum(res[(False, d1)][:2]) - d1 * (fwd + bwd), 0.0)
        entries[tp] = TPProfile(fwd_s=fwd, bwd_s=bwd, recompute_s=max(bwd_rc - bwd, 0.0), wgrad_s=bwd / 2,
                                act_bytes=act, ckpt_bytes=ckpt, optim_s=0.0, embed_s=0.0, head_s=ends,
                                head_act_bytes=micro_batch_size * m.seq_len * m.vocab / tp * 6)
    return Profile(model=m.name, micro_batch_size=micro_batch_size, seq_len=m.seq_len, layer_params=m.layer_params,
                   embed_params=m.embed_params, head_params=m.head_params, chips={chip: ChipProfile(entries)},
                   source="measured", meta={"device": str(dev), "torch": torch.__version__, "depths": list(depths)})
