"""AdamW over a flat parameter buffer, with ZeRO-1: each DP rank keeps optimizer state for 1/dp of it.

Gradients are all-reduced inside the DP group (chips of one type), each rank updates its shard, and the
updated shards are all-gathered. Adam is elementwise, so a sharded update equals the unsharded one; the
update is torch.optim.AdamW's (single-tensor) sequence of operations, so at dp 1 it matches it bit for bit.
Without ZeRO-1 (`zero1=False`, the training spec's `zero1: false`) every DP rank keeps the whole optimizer
state and, after the same all-reduce, applies the whole update itself: no all-gather, as HeteroAuto prices it.

Mixed precision (Megatron's scheme): with bf16 or fp16 parameters the optimizer keeps fp32 master weights
for its shard, reduces gradients in fp32 and keeps fp32 moments; the model's low-precision weights are the
master's rounding, gathered in their own dtype. fp16 adds a dynamic loss scale (LossScaler): a step whose
gradients hold an inf or NaN anywhere in the model is skipped and the scale halved.

Gradient clipping by global norm: the norm is the model's, over every stage, TP rank and DP shard. Each
rank sums the squares of the gradient elements it owns (its ZeRO shard; a parameter replicated across TP
ranks counted on one of them only) and one all-reduce over all ranks (`norm_group`) adds them up.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .hostmem import release_freed_memory


@dataclass
class LossScaler:
    """Dynamic loss scaling for fp16 (as torch.amp.GradScaler and Megatron): halve on overflow, double after
    `growth_interval` clean steps."""
    scale: float = 2.0 ** 16
    growth_interval: int = 1000
    min_scale: float = 1.0
    clean_steps: int = 0
    skipped: int = 0

    def update(self, overflow: bool) -> None:
        if overflow:
            self.scale, self.clean_steps, self.skipped = max(self.min_scale, self.scale / 2), 0, self.skipped + 1
        else:
            self.clean_steps += 1
            if self.clean_steps % self.growth_interval == 0:
                self.scale *= 2


_CHUNK = 1 << 16  # elements per fp64 / bool temporary in the norm and overflow checks (512 KiB at most)


@torch.no_grad()
def _after_accumulate(p: torch.Tensor) -> None:
    """Autograd accumulated into p.grad: note it, and move a gradient that is not the main_grad itself (bf16/fp16
    parameters: fp32 main_grad) into the main_grad, freeing it."""
    main = p.main_grad  # type: ignore[attr-defined]
    p.got_grad = True  # type: ignore[attr-defined]
    if p.grad is not None and p.grad.data_ptr() != main.data_ptr():
        main.add_(p.grad)
        p.grad = None if main.dtype != p.dtype else main


class ZeroAdamW:
    def __init__(self, params: list[nn.Parameter], lr: float, dp_group=None, dp_rank: int = 0, dp_size: int = 1,
                 betas: tuple[float, float] = (0.9, 0.95), eps: float = 1e-8, weight_decay: float = 0.01,
                 clip_norm: float | None = None, owned: list[bool] | None = None, norm_group: Any = None,
                 distributed_norm: bool = False, decay: list[bool] | None = None,
                 scaler: LossScaler | None = None, zero1: bool = True, presummed: bool = False) -> None:
        """`clip_norm`: scale gradients so their global L2 norm is at most this (None: no clipping).
        `owned[i]`: whether this rank counts parameter i in the norm (False for a TP replica's copy).
        `distributed_norm`: the norm spans ranks (all-reduced over `norm_group`, None = the world).
        `decay[i]`: whether weight decay applies to parameter i (None: to all).
        `scaler`: fp16's dynamic loss scale (the loss was multiplied by scaler.scale).
        `zero1`: shard the optimizer state over the DP group (False: every DP rank holds and updates it whole).
        `presummed`: the caller summed the gradients over the DP group already (replica_groups.py): no all-reduce."""
        if clip_norm is not None and not clip_norm > 0:
            raise ValueError(f"clip_norm must be positive, got {clip_norm}")
        self.params, self.lr, self.betas, self.eps, self.wd = params, lr, betas, eps, weight_decay
        self.clip_norm, self.norm_group, self.distributed_norm = clip_norm, norm_group, distributed_norm
        self.scaler = scaler
        self.last_norm: float | None = None
        self.group, self.dp_rank, self.dp_size, self.zero1 = dp_group, dp_rank, dp_size, zero1
        self.presummed = presummed
        total = sum(p.numel() for p in params)
        parts = dp_size if zero1 else 1  # shards of the optimizer state; without ZeRO-1 one, on every DP rank
        self.shard = -(-total // parts)
        self.padded = self.shard * parts
        dev, dtype = params[0].device, params[0].dtype
        if other := sorted({str(p.dtype) for p in params} - {str(dtype)}):
            raise ValueError(f"ZeroAdamW keeps one flat buffer, so every parameter must have one dtype: got {dtype} "
                             f"and {', '.join(other)}")
        self.dtype = dtype
        # state in at least fp32 (fp64 stays fp64)
        self.state_dtype = torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype
        sd = self.state_dtype
        self.lo = (dp_rank if zero1 else 0) * self.shard
        # The parameters and their gradients live in two flat buffers (padding zero) and are views of them,
        # so the model's weights and gradients are held once: the weights in their dtype (the update writes
        # them in place and the DP all-gather fills them), the gradients in the state dtype (fp32 reduction;
        # see heteropp.model.grads). The buffers are kept across steps: temporaries of this size made afresh
        # every step come from mmap on glibc, and faulting their pages in made a step 4-5x slower.
        self._w = self._bind_weights(torch.zeros(self.padded, device=dev, dtype=dtype))
        release_freed_memory()  # the parameters' own storage, now unused, before the state is allocated
        # fp32 master weights of this shard when the parameters are low precision; None: the parameters are
        # their own master
        self.master = self._w[self.lo:self.lo + self.shard].to(sd) if sd != dtype else None
        self.m = torch.zeros(self.shard, device=dev, dtype=sd)
        self.v = torch.zeros(self.shard, device=dev, dtype=sd)
        self._grads = torch.zeros(self.padded, device=dev, dtype=sd)
        self._bind_grads()
        self.t = 0
        # runs [a, b) of this shard that weight decay applies to, and that this rank counts in the norm
        self._decay_runs = self._runs(decay if decay is not None else [True] * len(params))
        owned = owned if owned is not None else [True] * len(params)
        if not zero1 and dp_rank > 0:  # every DP rank holds the whole gradient: the norm counts DP rank 0's
            owned = [False] * len(params)
        self._owned_runs = self._runs(owned)

    def _runs(self, flags: list[bool]) -> list[tuple[int, int]]:
        """The maximal runs [a, b) of this rank's shard covered by parameters whose flag is set."""
        runs: list[tuple[int, int]] = []
        off = 0
        for p, f in zip(self.params, flags):
            a, b = max(off, self.lo) - self.lo, min(off + p.numel(), self.lo + self.shard) - self.lo
            if f and a < b:
                if runs and runs[-1][1] == a:
                    a = runs.pop()[0]
                runs.append((a, b))
            off += p.numel()
        return runs

    @torch.no_grad()
    def _bind_weights(self, flat: torch.Tensor) -> torch.Tensor:
        off = 0
        for p in self.params:
            view = flat[off:off + p.numel()].view_as(p)
            view.copy_(p.detach())
            p.data = view
            off += p.numel()
        return flat

    def _bind_grads(self) -> None:
        off = 0
        for p in self.params:
            main = self._grads[off:off + p.numel()].view_as(p)
            p.got_grad = p.grad is not None  # type: ignore[attr-defined]
            if p.grad is not None:  # a gradient from before the optimizer existed is kept
                main.copy_(p.grad)
            p.main_grad = main  # type: ignore[attr-defined]
            self._rest_grad(p)
            if not getattr(p, "grad_hooked", False):  # once per parameter, whichever optimizer binds it later
                p.register_post_accumulate_grad_hook(_after_accumulate)
                p.grad_hooked = True  # type: ignore[attr-defined]
            off += p.numel()

    def _fill(self, flat: torch.Tensor, tensors: list[torch.Tensor]) -> torch.Tensor:
        """`flat` with the tensors copied in, in order (its padding stays zero)."""
        off = 0
        for t in tensors:
            flat[off:off + t.numel()].copy_(t.reshape(-1))
            off += t.numel()
        return flat

    def _rest_grad(self, p: nn.Parameter) -> None:
        """p.grad between backwards: the main_grad itself in fp32 (autograd adds into it), else None (each
        low-precision gradient is folded into the fp32 main_grad as it arrives)."""
        p.grad = None if self.state_dtype != self.dtype else p.main_grad  # type: ignore[attr-defined]

    def state_elems(self) -> int:
        """Elements of Adam's first moment this rank keeps (its shard under ZeRO-1, else the whole)."""
        return self.m.numel()

    def zero_grad(self) -> None:
        self._grads.zero_()
        for p in self.params:
            p.got_grad = False  # type: ignore[attr-defined]
            self._rest_grad(p)

    @torch.no_grad()
    def _take_assigned_grads(self) -> None:
        """A gradient assigned to `p.grad` directly (not accumulated by backward) replaces the accumulated one."""
        for p in self.params:
            g = p.grad
            if g is not None and not (g.data_ptr() == p.main_grad.data_ptr() and g.dtype == p.main_grad.dtype):
                p.main_grad.copy_(g)
                p.got_grad = True
                self._rest_grad(p)

    @torch.no_grad()
    def step(self) -> bool:
        """One update; False when fp16's loss scaler found an overflow and the step was skipped."""
        done, norm = step_shards([self], self.scaler, self.clip_norm, self.distributed_norm, self.norm_group)
        if norm is not None:
            self.last_norm = norm
        return done

    def reduced_shard(self) -> torch.Tensor:
        """This rank's shard of the gradient summed over the DP group (all-reduced here unless `presummed`)."""
        self._take_assigned_grads()
        missing = [i for i, p in enumerate(self.params) if not p.got_grad]
        if missing:
            raise RuntimeError(f"parameters {missing} got no gradient this step")
        grads = self._grads
        if self.dp_size > 1 and not self.presummed:
            dist.all_reduce(grads, group=self.group)
        return grads[self.lo:self.lo + self.shard]

    def owned_sumsq(self, g: torch.Tensor) -> torch.Tensor:
        """The sum of squares, in fp64, of the elements of the gradient shard `g` this rank counts in the norm;
        a chunk at a time (a whole fp64 copy of the shard would be the step's largest allocation)."""
        total = torch.zeros((), dtype=torch.float64, device=g.device)
        for a, b in self._owned_runs:
            for c in g[a:b].split(_CHUNK):
                total += c.double().square().sum()
        return total

    @torch.no_grad()
    def update(self, g: torch.Tensor) -> None:
        """Adam's update of this rank's shard from its (unscaled, clipped) gradient shard `g`, which it spends,
        then under ZeRO-1 the updated shards all-gathered over the DP group."""
        mine = self.master if self.master is not None else self._w[self.lo:self.lo + self.shard]
        self.t += 1
        lr, (b1, b2) = self.lr, self.betas
        # torch.optim.AdamW's single-tensor update, operation for operation
        for a, b in self._decay_runs:
            mine[a:b].mul_(1 - lr * self.wd)
        self.m.lerp_(g, 1 - b1)
        self.v.mul_(b2).addcmul_(g, g, value=1 - b2)
        step_size = lr / (1 - b1 ** self.t)
        # the gradient shard is spent: it holds the denominator, then the all-gather's input
        den = torch.sqrt(self.v, out=g).div_((1 - b2 ** self.t) ** 0.5).add_(self.eps)
        mine.addcdiv_(self.m, den, value=-step_size)
        if self.master is not None:
            self._w[self.lo:self.lo + self.shard].copy_(mine)  # the low-precision rounding of the master
        if self.zero1 and self.dp_size > 1:
            # the input apart from the outputs it is gathered into: the spent gradient shard's bytes
            src = g.view(self.dtype)[:self.shard]
            src.copy_(self._w[self.lo:self.lo + self.shard])
            dist.all_gather(list(self._w.split(self.shard)), src, group=self.group)

    # -- checkpoints: per-parameter state, whole over the DP group ----------------------------------
    def _gathered(self, shard: torch.Tensor) -> torch.Tensor:
        if self.dp_size == 1 or not self.zero1:
            return shard
        full = torch.empty(self.padded, dtype=shard.dtype, device=shard.device)
        dist.all_gather(list(full.split(self.shard)), shard.contiguous(), group=self.group)
        return full

    def full_state(self) -> dict[str, list[torch.Tensor]]:
        """Per parameter (in `params` order): the master weight (fp32 or the parameter itself), Adam's two
        moments, each whole (under ZeRO-1 gathered over the DP group: a collective, every DP rank must call it)."""
        if self.master is not None:
            weights = self._gathered(self.master)
        else:
            weights = self._w.clone()  # the parameters are views of it (a copy: training goes on writing it)
        m, v = self._gathered(self.m), self._gathered(self.v)
        out: dict[str, list[torch.Tensor]] = {"master": [], "exp_avg": [], "exp_avg_sq": []}
        off = 0
        for p in self.params:
            for key, flat in (("master", weights), ("exp_avg", m), ("exp_avg_sq", v)):
                out[key].append(flat[off:off + p.numel()].view(p.shape))
            off += p.numel()
        return out

    @torch.no_grad()
    def load_full_state(self, master: list[torch.Tensor], exp_avg: list[torch.Tensor],
                        exp_avg_sq: list[torch.Tensor], step: int) -> None:
        """The inverse of full_state: every DP rank passes the whole tensors and keeps its shard."""
        dev, sd = self.m.device, self.state_dtype
        flat = torch.zeros(self.padded, dtype=sd, device=dev)
        for src, dst in ((exp_avg, self.m), (exp_avg_sq, self.v)):
            dst.copy_(self._fill(flat, src)[self.lo:self.lo + self.shard])
        self._fill(flat, master)
        if self.master is not None:
            self.master.copy_(flat[self.lo:self.lo + self.shard])
        self._w.copy_(flat)  # every parameter at once: they are views of it
        self.t = step


@torch.no_grad()
def step_shards(opts: list[ZeroAdamW], scaler: LossScaler | None, clip_norm: float | None, distributed: bool,
                norm_group: Any) -> tuple[bool, float | None]:
    """One update of every optimizer in `opts` (each over its own parameters and DP group; together one rank's
    parameters): fp16's overflow check and the clipping's global norm span all of them. Returns whether the step
    was taken (False: an overflow somewhere, skipped) and the global norm where it clipped."""
    shards = [o.reduced_shard() for o in opts]
    if scaler is not None:
        # any inf or NaN in any rank's gradients (every rank must skip the same steps); a bool copy a chunk at a time
        finite = all(bool(torch.isfinite(c).all()) for g in shards for c in g.split(_CHUNK))
        bad = torch.tensor([0.0 if finite else 1.0])
        if distributed:
            dist.all_reduce(bad, op=dist.ReduceOp.MAX, group=norm_group)
        if bad.item() > 0:
            scaler.update(True)
            return False, None
        for g in shards:
            g.mul_(1.0 / scaler.scale)  # the scale this step's loss was multiplied by
        scaler.update(False)
    norm = None
    if clip_norm is not None:
        total = opts[0].owned_sumsq(shards[0])
        for o, g in zip(opts[1:], shards[1:]):
            total += o.owned_sumsq(g)
        sumsq = total.reshape(1).cpu()
        if distributed:
            dist.all_reduce(sumsq, group=norm_group)
        norm = math.sqrt(sumsq.item())
        coef = min(1.0, clip_norm / (norm + 1e-6))  # torch's clip_grad_norm_ coefficient
        for g in shards:
            g.mul_(coef)
    for o, g in zip(opts, shards):
        o.update(g)
    return True, norm
