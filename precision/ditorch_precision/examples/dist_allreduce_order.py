"""An honest pair of data-parallel runs that reduce the gradients in another order: the small
HuggingFace Llama under DistributedDataParallel on gloo, once with one gradient bucket and once with
many small ones. Gloo's ring all-reduce gives each rank a chunk of every bucket to start the sum
from, so another bucket layout sums each element in another rank order (with three or more ranks,
another rounding): the weights drift apart from the first step on, as they do between two
collective libraries. ``python -m ditorch_precision.examples.dist_allreduce_order OUT WORLD PORT
[--steps N] [--faults]`` writes OUT/{one_bucket,buckets}/capture/rank{r}/ and, with ``--faults``,
OUT/fault/: the many-bucket run with layer 1's ``mlp.down_proj`` mm 1e-3 off on rank r >= 1 at step
r - 1 only (one run finds a fault at each step, each after the drift the earlier ones left)."""
from __future__ import annotations

import os
from contextlib import nullcontext

import torch
from torch.nn.parallel import DistributedDataParallel

from ditorch_precision import Capture
from ditorch_precision.examples.faults import wrong_kernel
from ditorch_precision.examples.hf_llama import HFLlamaSize, hf_batches, make_hf_llama
from ditorch_precision.examples import gloo_job

ONE_BUCKET_MB = 25.0  # DDP's default: the whole small model in one bucket
SMALL_BUCKET_MB = 0.01  # a few parameters per bucket


def train_once(rank: int, out: str, bucket_mb: float, steps: int, fault_step: int | None = None,
               mode: str = "full") -> list[float]:
    size = HFLlamaSize()
    model = make_hf_llama(size, seed=0)
    losses = []
    with Capture(os.path.join(out, "capture", f"rank{rank}"), mode=mode, bulk=True):
        ddp = DistributedDataParallel(model, bucket_cap_mb=bucket_mb)
        opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
        for step, ids in enumerate(hf_batches(size, steps, seed=rank)):  # each rank its own data
            plant = (wrong_kernel("mm", 1 + 1e-3, inside=model.model.layers[1].mlp.down_proj)
                     if step == fault_step else nullcontext())
            opt.zero_grad(set_to_none=True)
            with plant:
                loss = ddp(input_ids=ids, labels=ids).loss
                loss.backward()
            opt.step()
            losses.append(loss.item())
    return losses


def worker(rank: int, world: int, port: int, out: str, steps: int, faults: bool, mode: str) -> None:
    with gloo_job.joined(rank, world, port):
        losses = {"one_bucket": train_once(rank, os.path.join(out, "one_bucket"), ONE_BUCKET_MB, steps, mode=mode),
                  "buckets": train_once(rank, os.path.join(out, "buckets"), SMALL_BUCKET_MB, steps, mode=mode)}
        if faults:
            train_once(rank, os.path.join(out, "fault"), SMALL_BUCKET_MB, steps, rank - 1 if rank else None, mode)
        with open(os.path.join(out, f"losses{rank}.txt"), "w") as f:
            for name, values in losses.items():
                f.write(f"{name} {' '.join(repr(v) for v in values)}\n")


def main() -> None:
    p = gloo_job.parser()
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--faults", action="store_true")
    p.add_argument("--mode", choices=("full", "stats"), default="full", help="the captures' mode")
    a = p.parse_args()
    gloo_job.start(worker, (a.world, a.port, a.out, a.steps, a.faults, a.mode), a.world, a.start_method)


if __name__ == "__main__":
    main()
