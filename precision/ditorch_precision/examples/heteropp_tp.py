"""The same heteropp model trained with tensor parallelism 1 and 2: an honest pair whose ops inside
the tensor-parallel layers have other shapes (each TP rank holds half of every projection) and whose
row-parallel outputs are summed in another order (two partial sums, then an all-reduce).

``python -m ditorch_precision.examples.heteropp_tp OUT WORLD PORT [--steps N] [--fault-rank R] [--fault-module M]
[--mode full|stats]``
(WORLD must be 2) writes OUT/tp1/capture/rank0/ (one process, no process group), OUT/tp2/capture/
rank{0,1}/ (two gloo processes, one TP group) and, with ``--fault-rank``, OUT/fault/capture/rank{0,1}/:
the TP 2 run with layer 0's feed-forward down projection (a row-parallel ``mm``; ``--fault-module``:
another of layer 0's projections, such as the column-parallel ``attn.wq``) 1e-3 off on rank R at
every step. Every run is a full heteropp ``StageModel`` (one stage, all layers) with torch's AdamW,
the same seed, so the same full weights before they are sharded, and the same tokens on every rank."""
from __future__ import annotations

import argparse
import os
from contextlib import nullcontext

import torch
import torch.distributed as dist

from ditorch_precision import Capture
from ditorch_precision.examples import gloo_job
from ditorch_precision.examples.faults import wrong_kernel
from heteropp.model.parallel import TPGroup
from heteropp.model.stage import StageModel
from heteropp.spec import ModelSpec

MODEL = ModelSpec(name="tp-pair", layers=2, hidden=32, heads=4, kv_heads=2, ffn=64, vocab=64, seq_len=8)
BATCH = 2
FAULTY = "ffn.down"  # the default planted module, in layer 0
PATH = "StageModel.layers.0."  # the module path a capture records for layer 0's modules


def batches(steps: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, MODEL.vocab, (BATCH, MODEL.seq_len + 1), generator=g) for _ in range(steps)]


def train(path: str, tp: TPGroup, steps: int, fault: str | None = None, mode: str = "full") -> list[float]:
    model = StageModel(MODEL, range(MODEL.layers), tp, seed=0, first=True, last=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    plant = wrong_kernel("mm", 1 + 1e-3, inside=model.layers["0"].get_submodule(fault)) if fault else nullcontext()
    losses = []
    with plant, Capture(path, mode=mode, bulk=True):
        for ids in batches(steps):
            opt.zero_grad(set_to_none=True)
            loss = model.loss(model(ids[:, :-1]), ids[:, 1:])
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return losses


def worker(rank: int, world: int, port: int, out: str, steps: int, fault_rank: int | None, fault_module: str,
           mode: str) -> None:
    with gloo_job.joined(rank, world, port):
        tp = TPGroup(rank=rank, size=world, group=dist.group.WORLD)
        losses = {"tp2": train(os.path.join(out, "tp2", "capture", f"rank{rank}"), tp, steps, mode=mode)}
        if fault_rank is not None:
            losses["fault"] = train(os.path.join(out, "fault", "capture", f"rank{rank}"), tp, steps,
                                    fault_module if rank == fault_rank else None, mode)
        _write_losses(out, f"rank{rank}", losses)


def _write_losses(out: str, name: str, losses: dict[str, list[float]]) -> None:
    with open(os.path.join(out, f"losses.{name}.txt"), "w") as f:
        for run, values in losses.items():
            f.write(f"{run} {' '.join(repr(v) for v in values)}\n")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("world", type=int, choices=(2,))
    p.add_argument("port", type=int)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--fault-rank", type=int, choices=(0, 1))
    p.add_argument("--fault-module", default=FAULTY, choices=("attn.wq", "attn.wk", "attn.wv", "attn.wo", "ffn.gate",
                                                                "ffn.up", "ffn.down"))
    p.add_argument("--mode", choices=("full", "stats"), default="full", help="the captures' mode")
    a = p.parse_args()
    torch.set_num_threads(1)
    os.makedirs(a.out, exist_ok=True)
    _write_losses(a.out, "tp1", {"tp1": train(os.path.join(a.out, "tp1", "capture", "rank0"), TPGroup(), a.steps,
                                              mode=a.mode)})
    # Forkserver (the default), never fork: this process has trained TP 1 by now.
    gloo_job.start(worker, (a.world, a.port, a.out, a.steps, a.fault_rank, a.fault_module, a.mode), a.world)


if __name__ == "__main__":
    main()
