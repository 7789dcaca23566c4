"""Auto-profiler: time a real LLaMA-style layer shard with torch on this machine.

One rank's shard of a TP group is emulated by dividing heads, KV heads and the FFN width by tp (TP
communication is not measured here). The embedding and head cost cancel by profiling two depths:
t_layer = (t(d2) - t(d1)) / (d2 - d1), t_ends = t(d1) - d1 * t_layer. Saved activations are counted
with saved-tensor hooks. Every timing is averaged over enough calls to last `min_time_s` (a tiny model's
layer would otherwise fall below the clock's resolution), after a warm-up call; the device comes from
ditorch's registry and is synchronised around each timer. The optimizer step (AdamW over one layer shard)
is timed too.
"""
from __future__ import annotations

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
    """A device through ditorch's registry: "device" is whatever accelerator ditorch detected (else the CPU);
    a vendor or chip name ("cuda", "npu", "nvidia", "cpu", optionally with ":index") maps to its torch type."""
    import ditorch
    if name in ("device", ""):
        return torch.device(ditorch.current_adapter().device_type)
    base, _, index = name.partition(":")
    kind = ditorch.adapter_for(base).device_type
    return torch.device(f"{kind}:{index}" if index else kind)


def _sync(dev: torch.device) -> None:
    if dev.type != "cpu":  # kernels run asynchronously: a timer must wait for them
        import ditorch
        ditorch.device.synchronize()


def _repeat(run: Callable[[], tuple[float, ...]], min_time_s: float) -> tuple[float, ...]:
    """Mean of `run`'s timings over as many calls as it takes for their sum to reach `min_time_s`, so that a
    tiny layer is never timed below the clock's resolution."""
    total, n = None, 0
    while n == 0 or sum(total) < min_time_s:
        got = run()
        total = got if total is None else tuple(a + b for a, b in zip(total, got))
        n += 1
    return tuple(t / n for t in total)


def _timer(net: _Net, tokens: torch.Tensor, dev: torch.device) -> tuple[Callable[[], tuple[float, float]], list[int]]:
    """A call that times one forward and one backward; the list holds the bytes saved for backward."""
    saved = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[0] += t.numel() * t.element_size()
        return t

    def once() -> tuple[float, float]:
        saved[0] = 0
        _sync(dev)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            t0 = time.perf_counter()
            loss = net(tokens)
            _sync(dev)
            t1 = time.perf_counter()
        loss.backward()
        _sync(dev)
        t2 = time.perf_counter()
        net.zero_grad(set_to_none=True)
        return t1 - t0, t2 - t1

    once()  # warms up allocators and kernels
    return once, saved


def _time_depths(nets: dict[int, _Net], tokens: torch.Tensor, repeats: int, min_time_s: float,
                 dev: torch.device) -> dict[int, tuple[float, float, float]]:
    """Per depth: least forward and backward time over `repeats` rounds (each a mean over at least
    `min_time_s`), and bytes saved for backward. The depths alternate within a round, so a burst of load
    from elsewhere hits both and cancels in their difference; the least is the run least disturbed."""
    timers = {d: _timer(net, tokens, dev) for d, net in nets.items()}
    runs: dict[int, list[tuple[float, ...]]] = {d: [] for d in nets}
    for _ in range(repeats):
        for d, (once, _) in timers.items():
            runs[d].append(_repeat(once, min_time_s))
    return {d: (min(r[0] for r in runs[d]), min(r[1] for r in runs[d]), float(timers[d][1][0])) for d in nets}


def _optim_time(layer: _Layer, repeats: int, min_time_s: float, dev: torch.device) -> float:
    """One AdamW step over a layer shard's parameters (fp32 master weights and two moments, as ZeRO-1 keeps)."""
    params = [p.detach().float().requires_grad_() for p in layer.parameters()]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW(params, lr=1e-4)

    def once() -> tuple[float]:
        _sync(dev)
        t0 = time.perf_counter()
        opt.step()
        _sync(dev)
        return (time.perf_counter() - t0,)

    once()
    return min(_repeat(once, min_time_s)[0] for _ in range(repeats))


def profile_model(model: str, tps: list[int], device: str = "cpu", chip: str = "cpu", seq_len: int | None = None,
                  micro_batch_size: int = 1, repeats: int = 3, depths: tuple[int, int] = (1, 3),
                  progress: Callable[[str], None] | None = None, min_time_s: float = 0.02) -> Profile:
    m = load_model(model)
    if seq_len:
        from dataclasses import replace
        m = replace(m, seq_len=seq_len)
    dev = _resolve_device(device)
    threads = torch.get_num_threads()
    if dev.type == "cpu":  # one core per "chip": threads spinning against other load swamp a tiny layer
        torch.set_num_threads(1)
    try:
        return _profile(m, tps, dev, chip, micro_batch_size, repeats, depths, progress, min_time_s)
    finally:
        torch.set_num_threads(threads)


def _profile(m, tps: list[int], dev: torch.device, chip: str, micro_batch_size: int, repeats: int,
             depths: tuple[int, int], progress: Callable[[str], None] | None, min_time_s: float) -> Profile:
    torch.manual_seed(0)
    entries = {}
    d1, d2 = depths
    for tp in tps:
        if m.heads % tp or m.kv_heads % tp and tp > m.kv_heads:
            raise ValueError(f"tp={tp} does not divide the model's {m.heads} heads")
        tokens = torch.randint(0, m.vocab, (micro_batch_size, m.seq_len), device=dev)
        res = {}
        for rc in (False, True):
            if progress:
                progress(f"profiling tp={tp} depths {d1},{d2} recompute={'on' if rc else 'off'} on {dev}")
            got = _time_depths({d: _Net(m, tp, d, rc).to(dev) for d in (d1, d2)}, tokens, repeats, min_time_s, dev)
            res.update({(rc, d): v for d, v in got.items()})
        per = lambda rc, i: max((res[(rc, d2)][i] - res[(rc, d1)][i]) / (d2 - d1), 0.0)  # noqa: E731
        fwd, bwd, act = per(False, 0), per(False, 1), per(False, 2)
        bwd_rc, ckpt = per(True, 1), per(True, 2)
        ends = max(sum(res[(False, d1)][:2]) - d1 * (fwd + bwd), 0.0)
        if progress:
            progress(f"profiling tp={tp} optimizer step on {dev}")
        optim = _optim_time(_Net(m, tp, 1, False).to(dev).layers[0], repeats, min_time_s, dev)
        entries[tp] = TPProfile(fwd_s=fwd, bwd_s=bwd, recompute_s=max(bwd_rc - bwd, 0.0), wgrad_s=bwd / 2,
                                act_bytes=act, ckpt_bytes=ckpt, optim_s=optim, embed_s=0.0, head_s=ends,
                                head_act_bytes=micro_batch_size * m.seq_len * m.vocab / tp * 6)
    return Profile(model=m.name, micro_batch_size=micro_batch_size, seq_len=m.seq_len, layer_params=m.layer_params,
                   embed_params=m.embed_params, head_params=m.head_params, chips={chip: ChipProfile(entries)},
                   source="measured", meta={"device": str(dev), "torch": torch.__version__, "depths": list(depths),
                                                   "min_time_s": min_time_s, "repeats": repeats})
