"""The single-process reference: the whole model, no parallelism, the same data, init, precision, optimizer,
schedule and checkpoints as the engine."""
from __future__ import annotations

import dataclasses
import time

import torch

from ..model import TPGroup
from ..model.grads import grad_of
from ..spec import ModelSpec
from .build import build_chunks, make_optimizer, resume, schedule
from .checkpoint import Checkpointer, slots
from .config import TrainOptions
from .data import Batches
from .metrics import StepLog


def train_reference(m: ModelSpec, steps: int, sequences: int, seed: int = 0, lr: float = 3e-3,
                    loss_log: str | None = None, collect_grads: bool = False, verbose: bool = True,
                    clip_grad: float | None = None, collect_params: bool = False,
                    opts: TrainOptions | None = None) -> dict:
    """`collect_grads`: return every step's gradients (a list of {name: tensor}); `collect_params`: the
    parameters after the last step. Both as the engine's RunConfig fields of the same names."""
    opts = opts or TrainOptions()
    torch.set_num_threads(1)
    model = build_chunks(m, [(range(m.layers), True, True, False)], TPGroup(), seed, opts, torch.device("cpu"))[0]
    named = list(model.named_parameters())
    opt = make_optimizer(named, lr, opts, clip_grad)
    sched = schedule(lr, steps, opts)
    ckpt = Checkpointer(opts.checkpoint_dir, m, slots(named, m, 0, 1, True, False), keep=opts.keep_checkpoints,
                        async_save=False) if opts.checkpoint_dir else None
    start = resume(opt, ckpt, opts) if ckpt is not None and opts.resume else 0
    losses, norms = [], []
    grads: list[dict[str, torch.Tensor]] | None = [] if collect_grads else None
    log = StepLog(loss_log, start, m, sequences, steps, "reference", opts.peak_flops, echo=verbose)
    data = Batches(m, seed, sequences, opts.data)
    for step in range(start + 1, steps + 1):
        t0 = time.perf_counter()
        batch = data.rows(step, 0, sequences)
        opt.zero_grad()
        opt.lr = sched.at(step)
        scale = opt.scaler.scale if opt.scaler is not None else 1.0
        loss = model.loss(model(batch[:, :-1]), batch[:, 1:])
        (loss * scale).backward()
        if grads is not None:
            grads.append({n: grad_of(p).detach().clone() for n, p in model.named_parameters()})
        opt.step()
        norms.append(opt.last_norm)
        losses.append(loss.item())
        log.step(step, loss.item(), opt.lr, opt.last_norm, time.perf_counter() - t0, None, opt.scaler)
        if ckpt is not None and (step == steps or (opts.save_every and step % opts.save_every == 0)):
            ckpt.save(step, opt.full_state(), {"opt_step": opt.t, "seed": seed, "dtype": opts.dtype, "data": opts.data,
                                               "hf_config": opts.hf_config,
                                               "lr_schedule": dataclasses.asdict(sched),
                                               "loss_scale": opt.scaler.scale if opt.scaler else None,
                                               "skipped": opt.scaler.skipped if opt.scaler else 0})
    log.close()
    params = {n: p.detach().clone() for n, p in model.named_parameters()} if collect_params else None
    return {"losses": losses, "grads": grads, "params": params, "grad_norms": norms, "start_step": start}
