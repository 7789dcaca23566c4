"""Data-parallel training of the small HuggingFace Llama with hand-written gradient all-reduces
(c10d::allreduce_, through the dispatcher the tools see), one process per rank on gloo, under
Capture and AutoCompare:
``python -m ditorch_precision.examples.dist_llama OUT WORLD PORT [--fault-rank R] [--honest OUT2]
[--collectives OUT3]``.
Each rank writes OUT/capture/rank{r}/ and OUT/autocompare_rank{r}.json; with ``--honest OUT2`` the
same processes first run once without the fault into OUT2 (one launch for a reference and a test run);
with ``--collectives OUT3`` they first run ``dist_collectives`` into OUT3 (one launch for both examples)."""
from __future__ import annotations

import json
import os
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from ditorch_precision import AutoCompare, Capture
from ditorch_precision.examples import dist_collectives, gloo_job
from ditorch_precision.examples.faults import wrong_kernel
from ditorch_precision.examples.hf_llama import HFLlamaSize, hf_batches, make_hf_llama


def worker(rank: int, world: int, port: int, out: str, fault_rank: int | None, honest: str | None,
           collectives: str | None = None) -> None:
    with gloo_job.joined(rank, world, port):
        if collectives:
            dist_collectives.run(rank, world, collectives)
        if honest:
            train_once(rank, world, honest, None)
        train_once(rank, world, out, fault_rank)


def train_once(rank: int, world: int, out: str, fault_rank: int | None) -> None:
    size = HFLlamaSize()
    model = make_hf_llama(size, seed=0)  # the same weights on every rank
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = hf_batches(size, 1, seed=rank)[0]  # each rank its own data
    plant = (wrong_kernel("mm", 1 + 1e-4, inside=model.model.layers[1].mlp.down_proj) if rank == fault_rank
             else nullcontext())
    with plant, Capture(os.path.join(out, "capture", f"rank{rank}")), AutoCompare() as ac:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world
        mean_loss = funcol.all_reduce(loss.detach(), "avg", dist.group.WORLD) * 1  # a functional collective
        opt.step()
        ac.check_collectives()  # while the process group is alive
    with open(os.path.join(out, f"autocompare_rank{rank}.json"), "w") as f:
        json.dump({"failures": ac.failures, "mean_loss": float(mean_loss), "loss": float(loss),
                   "collectives": [r for r in ac.results if r.get("rule") == "collective"],
                   "n_params": len(list(model.parameters()))}, f)


def main() -> None:
    p = gloo_job.parser()
    p.add_argument("--fault-rank", type=int)
    p.add_argument("--honest", metavar="OUT2", help="first a run without the fault, into OUT2")
    p.add_argument("--collectives", metavar="OUT3", help="first the dist_collectives example, into OUT3")
    a = p.parse_args()
    gloo_job.start(worker, (a.world, a.port, a.out, a.fault_rank, a.honest, a.collectives), a.world, a.start_method)


if __name__ == "__main__":
    main()
