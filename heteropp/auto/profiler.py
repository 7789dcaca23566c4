"""Auto-profiler: time a real LLaMA-style layer shard with torch on this machine.

The timed network is the engine's own StageModel (heteropp.model); one rank's shard of a TP group is
built at the group's shapes with its collectives skipped, unless the caller passes a TP group of real
ranks (then its collectives are timed with the compute). The embedding and head cost cancel by profiling
two depths:
t_layer = (t(d2) - t(d1)) / (d2 - d1), t_ends = t(d1) - d1 * t_layer. Saved activations are counted
with saved-tensor hooks. Every timing is averaged over enough calls to last `min_time_s` (a tiny model's
layer would otherwise fall below the clock's resolution), after a warm-up call; the device comes from
ditorch's registry and is synchronised around each timer. The optimizer step (AdamW over one layer shard)
is timed too.
"""
from __future__ import annotations

import time
from typing import Callable

import statistics

import torch
from torch import nn

from ..model import StageModel, TPGroup, WeightGradStore
from ..plan import tp_split_error
from ..spec import ModelSpec, load_model
from .profiles import ChipProfile, Profile, TPProfile


class _LocalTP(TPGroup):
    """One rank's shard of a TP group, alone: shapes as in the group, collectives skipped (timed apart)."""

    def all_reduce(self, t: torch.Tensor, op: object = None) -> torch.Tensor:
        return t


class _Net(nn.Module):
    """The engine's own stage (embedding, `depth` decoder blocks, head and loss) at one TP rank's shard."""

    def __init__(self, m: ModelSpec, tp: TPGroup, depth: int, recompute: bool) -> None:
        super().__init__()
        self.tp = tp
        self.stage = StageModel(m, range(depth), tp, seed=0, first=True, last=True, recompute=recompute)
        self.layers = list(self.stage.layers.values())

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.stage.loss(self.stage(tokens), tokens)


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


def _more(short: bool, tp: TPGroup) -> bool:
    """Whether to time another call; the ranks of a real TP group agree (their collectives must pair up)."""
    if tp.group is None:
        return short
    flag = torch.tensor([float(short)])
    return bool(tp.all_reduce(flag, op=torch.distributed.ReduceOp.MAX).item())


_NO_TP = TPGroup()  # size 1: no collectives


def _repeat(run: Callable[[], tuple[float, ...]], min_time_s: float, tp: TPGroup = _NO_TP) -> tuple[float, ...]:
    """Mean of `run`'s timings over as many calls as it takes for their sum to reach `min_time_s`, so that a
    tiny layer is never timed below the clock's resolution."""
    total, n = run(), 1
    while _more(sum(total) < min_time_s, tp):
        total = tuple(a + b for a, b in zip(total, run()))
        n += 1
    return tuple(t / n for t in total)


def _timer(net: _Net, tokens: torch.Tensor, dev: torch.device,
           split: bool = False) -> tuple[Callable[[], tuple[float, ...]], list[int]]:
    """A call that times one forward and one backward (`split`: the backward as the engine's ZB-H1 runs it,
    an input-gradient pass with the weight gradients deferred, then the weight-gradient pass); the list holds
    the bytes saved for backward."""
    saved = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[0] += t.numel() * t.element_size()
        return t

    def once() -> tuple[float, ...]:
        saved[0] = 0
        _sync(dev)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            t0 = time.perf_counter()
            loss = net(tokens)
            _sync(dev)
            t1 = time.perf_counter()
        if split:
            with WeightGradStore() as store:
                loss.backward()
            _sync(dev)
            t2 = time.perf_counter()
            store.flush()
            _sync(dev)
            out: tuple[float, ...] = (t1 - t0, t2 - t1, time.perf_counter() - t2)
        else:
            loss.backward()
            _sync(dev)
            out = (t1 - t0, time.perf_counter() - t1)
        net.zero_grad(set_to_none=True)
        return out

    once()  # warms up allocators and kernels
    return once, saved


def _time_depths(nets: dict[int, _Net], tokens: torch.Tensor, repeats: int, min_time_s: float,
                 dev: torch.device, stat: str = "min", split: bool = False) -> dict[int, tuple[float, ...]]:
    """Per depth: least (or median, `stat`) forward and backward times (`split`: forward, input-gradient and
    weight-gradient passes) over `repeats` rounds (each a mean over at least `min_time_s`), and last the
    bytes saved for backward. The depths alternate within a round, so a burst of load from elsewhere hits
    both and cancels in their difference; the least is the run least disturbed, the median the typical one
    (what ranks sharing cores see)."""
    pick = min if stat == "min" else statistics.median
    timers = {d: _timer(net, tokens, dev, split) for d, net in nets.items()}
    net = next(iter(nets.values()))
    runs: dict[int, list[tuple[float, ...]]] = {d: [] for d in nets}
    for _ in range(repeats):
        for d, (once, _) in timers.items():
            runs[d].append(_repeat(once, min_time_s, net.tp))
    return {d: (*(pick(r[i] for r in runs[d]) for i in range(len(runs[d][0]))), float(timers[d][1][0]))
            for d in nets}


def _layer_flops(nets: dict[int, _Net], tokens: torch.Tensor) -> tuple[float, float]:
    """Forward and backward FLOPs of one decoder layer as torch's counter sees them, by the same two-depth
    difference as the timings: a check of what was timed that does not depend on the machine's load."""
    from torch.utils.flop_counter import FlopCounterMode
    per = {}
    for d, net in nets.items():
        with FlopCounterMode(display=False) as fwd:
            loss = net(tokens)
        with FlopCounterMode(display=False) as bwd:
            loss.backward()
        net.zero_grad(set_to_none=True)
        per[d] = (fwd.get_total_flops(), bwd.get_total_flops())
    (d1, f1), (d2, f2) = sorted(per.items())
    return tuple((b - a) / (d2 - d1) for a, b in zip(f1, f2))


def _optim_time(layer: nn.Module, repeats: int, min_time_s: float, dev: torch.device) -> float:
    """One step of the engine's optimizer (ZeroAdamW, dp 1) over a layer shard's parameters."""
    from ..engine.optim import ZeroAdamW
    params = [nn.Parameter(p.detach().float().clone()) for p in layer.parameters()]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = ZeroAdamW(params, 1e-4)

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
                  progress: Callable[[str], None] | None = None, min_time_s: float = 0.02, stat: str = "min",
                  tp_group: TPGroup | None = None) -> Profile:
    """`stat`: "min" keeps each timing's least-disturbed round, "median" its typical one (for a profile taken
    under deliberate contention). `tp_group`: a TP group of real ranks, all calling this at once; the entry
    for its size is then timed with its collectives (other sizes stay local shards without them)."""
    if stat not in ("min", "median"):
        raise ValueError(f"stat must be 'min' or 'median', not {stat!r}")
    m = load_model(model)
    if seq_len:
        from dataclasses import replace
        m = replace(m, seq_len=seq_len)
    dev = _resolve_device(device)
    threads = torch.get_num_threads()
    if dev.type == "cpu":  # one core per "chip": threads spinning against other load swamp a tiny layer
        torch.set_num_threads(1)
    try:
        return _profile(m, tps, dev, chip, micro_batch_size, repeats, depths, progress, min_time_s, stat,
                        tp_group)
    finally:
        torch.set_num_threads(threads)


def _profile(m: ModelSpec, tps: list[int], dev: torch.device, chip: str, micro_batch_size: int, repeats: int,
             depths: tuple[int, int], progress: Callable[[str], None] | None, min_time_s: float, stat: str,
             tp_group: TPGroup | None) -> Profile:
    torch.manual_seed(0)
    entries: dict[int, TPProfile] = {}
    flops: dict[str, list[float]] = {}
    d1, d2 = depths
    for tp in tps:
        if (why := tp_split_error(tp, m.heads, m.kv_heads, m.ffn, m.vocab)) is not None:
            raise ValueError(f"cannot profile {m.name}: {why[0]}; expected a tp that is {why[1]}")
        tokens = torch.randint(0, m.vocab, (micro_batch_size, m.seq_len), device=dev)
        group = tp_group if tp_group is not None and tp_group.size == tp else _LocalTP(0, tp)
        res: dict[tuple[bool, int], tuple[float, ...]] = {}
        nets = {rc: {d: _Net(m, group, d, rc).to(dev) for d in (d1, d2)} for rc in (False, True)}
        for rc in (False, True):
            if progress:
                progress(f"profiling tp={tp} depths {d1},{d2} recompute={'on' if rc else 'off'} on {dev}")
            got = _time_depths(nets[rc], tokens, repeats, min_time_s, dev, stat)
            res.update({(rc, d): v for d, v in got.items()})

        # `res` bound now, though used only in this iteration
        def per(rc: bool, i: int, res: dict[tuple[bool, int], tuple[float, ...]] = res) -> float:
            return max((res[(rc, d2)][i] - res[(rc, d1)][i]) / (d2 - d1), 0.0)

        fwd, bwd, act = per(False, 0), per(False, 1), per(False, 2)
        bwd_rc, ckpt = per(True, 1), per(True, 2)
        ends = max(sum(res[(False, d1)][:2]) - d1 * (fwd + bwd), 0.0)
        # The weight-gradient share of the backward as the engine splits it for ZB-H1, measured: it depends on
        # how much of the backward is outside the linear layers (on this CPU ~0.45 for the benchmark model,
        # ~0.2 for the tiny preset), not the half that counting matmuls gives
        if progress:
            progress(f"profiling tp={tp} depths {d1},{d2} backward split into input and weight gradients on {dev}")
        got = _time_depths(nets[False], tokens, repeats, min_time_s, dev, stat, split=True)
        i_s, w_s = ((got[d2][k] - got[d1][k]) / (d2 - d1) for k in (1, 2))
        share = w_s / (i_s + w_s) if i_s > 0 and w_s > 0 else 0.5  # a tiny layer's differences can come out 0
        if progress:
            progress(f"profiling tp={tp} optimizer step on {dev}")
        flops[str(tp)] = list(_layer_flops(nets[False], tokens))
        optim = _optim_time(_Net(m, _LocalTP(0, tp), 1, False).to(dev).layers[0], repeats, min_time_s, dev)
        entries[tp] = TPProfile(fwd_s=fwd, bwd_s=bwd, recompute_s=max(bwd_rc - bwd, 0.0), wgrad_s=bwd * share,
                                act_bytes=act, ckpt_bytes=ckpt, optim_s=optim, embed_s=0.0, head_s=ends,
                                head_act_bytes=micro_batch_size * m.seq_len * m.vocab / tp * 6)
    return Profile(model=m.name, micro_batch_size=micro_batch_size, seq_len=m.seq_len, layer_params=m.layer_params,
                   embed_params=m.embed_params, head_params=m.head_params, chips={chip: ChipProfile(entries)},
                   source="measured", meta={"device": str(dev), "torch": torch.__version__, "depths": list(depths),
                                                   "min_time_s": min_time_s, "repeats": repeats,
                                                   "stat": stat, "tp_collectives": tp_group.size if tp_group else None,
                                                   "layer_flops": flops})
