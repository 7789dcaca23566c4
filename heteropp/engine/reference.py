"""The single-process reference: the whole model, no parallelism, the same data, init and optimizer."""
from __future__ import annotations

import json
import time

import torch

from ..model import StageModel, TPGroup
from ..spec import ModelSpec
from .data import global_batch
from .optim import ZeroAdamW


def train_reference(m: ModelSpec, steps: int, sequences: int, seed: int = 0, lr: float = 3e-3,
                    loss_log: str | None = None, collect_grads: bool = False, verbose: bool = True,
                    clip_grad: float | None = None, collect_params: bool = False) -> dict:
    """`collect_grads`: return every step's gradients (a list of {name: tensor}); `collect_params`: the
    parameters after the last step. Both as the engine's RunConfig fields of the same names."""
    torch.set_num_threads(1)
    model = StageModel(m, range(m.layers), TPGroup(), seed=seed, first=True, last=True)
    opt = ZeroAdamW(list(model.parameters()), lr, clip_norm=clip_grad)
    losses, norms = [], []
    grads: list[dict[str, torch.Tensor]] | None = [] if collect_grads else None
    log = open(loss_log, "w") if loss_log else None
    for step in range(1, steps + 1):
        t0 = time.perf_counter()
        batch = global_batch(m, seed, step, sequences)
        opt.zero_grad()
        loss = model.loss(model(batch[:, :-1]), batch[:, 1:])
        loss.backward()
        if grads is not None:
            grads.append({n: p.grad.detach().clone() for n, p in model.named_parameters()})
        opt.step()
        norms.append(opt.last_norm)
        losses.append(loss.item())
        if verbose:
            print(f"[reference] step {step:4d}  loss {loss.item():.6f}  "
                  f"{sequences * m.seq_len / (time.perf_counter() - t0):9.0f} tokens/s", flush=True)
        if log:
            log.write(json.dumps({"step": step, "loss": loss.item()}) + "\n")
    if log:
        log.close()
    params = {n: p.detach().clone() for n, p in model.named_parameters()} if collect_params else None
    return {"losses": losses, "grads": grads, "params": params, "grad_norms": norms}
