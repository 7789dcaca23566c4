"""What the workers and the single-process reference build alike: a stage's model chunks in the run's dtype
(fresh from the seed or from HF weights), the optimizer with its precision and schedule, and the per-step
learning rate."""
from __future__ import annotations

from typing import Any

import torch

from ..model import StageModel, TPGroup
from ..model.hf_weights import load_hf_weights
from ..model.init import skip_init
from ..spec import ModelSpec
from .checkpoint import Checkpointer
from .config import TrainOptions
from .lr import LRSchedule
from .holder_optim import HolderAdamW
from .optim import LossScaler, ZeroAdamW
from .replica_groups import HolderGroups

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def build_chunks(m: ModelSpec, layer_ranges: list[tuple[range, bool, bool, bool]], tp: TPGroup, seed: int,
                 opts: TrainOptions, device: torch.device) -> list[StageModel]:
    """One StageModel per (layers, first, last, recompute), initialised from `opts.init_from`'s safetensors
    (this TP rank's slices only) or from the seed, in the run's dtype on `device`."""
    def make() -> list[StageModel]:
        return [StageModel(m, layers, tp, seed=seed, first=first, last=last, recompute=rc)
                for layers, first, last, rc in layer_ranges]

    if opts.init_from:
        with skip_init():  # every value is loaded next
            chunks = make()
        load_hf_weights(chunks, m, opts.init_from, tp.rank, tp.size)
    else:
        chunks = make()
    return [_moved(c, device, TORCH_DTYPES[opts.dtype]) for c in chunks]


def _moved(chunk: StageModel, device: torch.device, dtype: torch.dtype) -> StageModel:
    """`chunk` on `device` in `dtype`, its parameters' own attributes (shard_dim, ...) kept: to a device whose
    tensors are of another kind than the CPU's (a vendor's torch device, as diopi or npu), Module.to makes new
    Parameter objects, which have none of them."""
    attrs = {name: dict(p.__dict__) for name, p in chunk.named_parameters()}
    chunk = chunk.to(device=device, dtype=dtype)
    for name, p in chunk.named_parameters():
        for key, value in attrs[name].items():
            if not hasattr(p, key):
                setattr(p, key, value)
    return chunk


def make_optimizer(named: list[tuple[str, torch.nn.Parameter]], lr: float, opts: TrainOptions, clip: float | None,
                   dp: Any = None, dp_rank: int = 0, dp_size: int = 1, owned: list[bool] | None = None,
                   distributed: bool = False, holders: HolderGroups | None = None) -> ZeroAdamW | HolderAdamW:
    """AdamW with weight decay on matrices only (norms and biases are 1-D: no decay, as Megatron and HF do).
    `holders`: this rank's place in a plan of replica groups trained with ZeRO-1 (each part's state sharded over
    its holders, holder_optim.py; `dp` unused)."""
    params, decay = [p for _, p in named], [p.ndim > 1 for _, p in named]
    scaler = LossScaler() if opts.dtype == "fp16" else None
    if holders is not None:
        return HolderAdamW(params, [name for name, _ in named], holders, lr, weight_decay=opts.weight_decay,
                           decay=decay, owned=owned if owned is not None else [True] * len(params), clip_norm=clip,
                           distributed_norm=distributed, scaler=scaler)
    return ZeroAdamW(params, lr, dp, dp_rank, dp_size, weight_decay=opts.weight_decay, clip_norm=clip, owned=owned,
                     distributed_norm=distributed, decay=decay, scaler=scaler, zero1=opts.zero1)


def resume(opt: ZeroAdamW | HolderAdamW, ckpt: Checkpointer, opts: TrainOptions) -> int:
    """Load the newest complete checkpoint into the optimizer (weights, moments, step, loss scale; the moments
    and step afresh with `reset_optimizer`); returns the step it was saved after."""
    state = {k: [x.clone() for x in v] for k, v in opt.full_state().items()}
    meta = ckpt.load(state)
    if opts.reset_optimizer:
        state["exp_avg"] = [torch.zeros_like(x) for x in state["exp_avg"]]
        state["exp_avg_sq"] = [torch.zeros_like(x) for x in state["exp_avg_sq"]]
    opt.load_full_state(state["master"], state["exp_avg"], state["exp_avg_sq"],
                        0 if opts.reset_optimizer else meta["opt_step"])
    if opt.scaler is not None and meta.get("loss_scale"):
        opt.scaler.scale, opt.scaler.skipped = meta["loss_scale"], meta.get("skipped", 0)
    return int(meta["step"])


def schedule(lr: float, steps: int, opts: TrainOptions) -> LRSchedule:
    return LRSchedule(lr, opts.warmup_steps, opts.lr_decay, steps, opts.min_lr)
