"""Data-parallel training of the small HuggingFace Llama under torch's DistributedDataParallel (its
C++ reducer copies the gradients into buckets that ``aten::empty`` allocates, views them with
``as_strided`` and all-reduces them), one process per rank on gloo, under Capture:
``python -m ditorch_precision.examples.dist_ddp OUT WORLD PORT [--fault-rank R] [--steps N] [--mode M]
[--hook H] [--bucket-view]`` (Capture's mode and op hook).
The same processes run once honestly into OUT/ref and once with a fault (layer 1's
``mlp.down_proj`` mm 1e-4 off on rank R) into OUT/fault; each writes OUT/{ref,fault}/capture/rank{r}/.
``--bucket-view``: the second run's DDP keeps the gradients as views of its buckets
(``gradient_as_bucket_view``), where the first copies them out: an honest difference of the runs."""
from __future__ import annotations

import os
from contextlib import nullcontext

import torch
from torch.nn.parallel import DistributedDataParallel

from ditorch_precision import Capture
from ditorch_precision.examples.faults import wrong_kernel
from ditorch_precision.examples.hf_llama import HFLlamaSize, hf_batches, make_hf_llama
from ditorch_precision.examples import gloo_job


def train_once(rank: int, out: str, fault_rank: int | None, steps: int, mode: str = "full", hook: str = "auto",
               bucket_view: bool = False) -> None:
    size = HFLlamaSize()
    model = make_hf_llama(size, seed=0)
    plant = (wrong_kernel("mm", 1 + 1e-4, inside=model.model.layers[1].mlp.down_proj) if rank == fault_rank
             else nullcontext())
    with plant, Capture(os.path.join(out, "capture", f"rank{rank}"), mode=mode, hook=hook):
        # wrapped under the capture: the reducer allocates its buckets (aten::empty) here, as it
        # does again when it rebuilds them at the second step
        ddp = DistributedDataParallel(model, bucket_cap_mb=0.01, gradient_as_bucket_view=bucket_view)
        opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
        for ids in hf_batches(size, steps, seed=rank):  # each rank its own data
            opt.zero_grad(set_to_none=True)
            ddp(input_ids=ids, labels=ids).loss.backward()
            opt.step()


def worker(rank: int, world: int, port: int, out: str, fault_rank: int | None, steps: int, mode: str,
           hook: str, bucket_view: bool) -> None:
    with gloo_job.joined(rank, world, port):
        train_once(rank, os.path.join(out, "ref"), None, steps, mode, hook)
        train_once(rank, os.path.join(out, "fault"), fault_rank, steps, mode, hook, bucket_view)


def main() -> None:
    p = gloo_job.parser()
    p.add_argument("--fault-rank", type=int)
    p.add_argument("--steps", type=int, default=1)
    p.add_argument("--mode", default="full", choices=("full", "stats"))
    p.add_argument("--hook", default="auto", choices=("auto", "cpp", "python"))
    p.add_argument("--bucket-view", action="store_true")
    a = p.parse_args()
    gloo_job.start(worker, (a.world, a.port, a.out, a.fault_rank, a.steps, a.mode, a.hook, a.bucket_view), a.world,
                   a.start_method)


if __name__ == "__main__":
    main()
