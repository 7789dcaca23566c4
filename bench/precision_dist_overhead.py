"""Overhead of a capture on a 2-rank gloo job's training step: a stats capture through the C++ op
observer (``hook="auto"``, which takes it under torch.distributed) and through the Python dispatch
mode, and a full capture (bulk, its part files written in the background; the capture's exit waits
for them), against the plain step. Each rank trains the bench Llama of ``bench.precision_overhead`` under
DistributedDataParallel (its gradients all-reduced in buckets) and, each step, hands its input
embeddings to the other rank and takes the other's (``batch_isend_irecv``, a pipeline's stage
hand-off; the received tensor is used). Every round runs each variant for --steps steps (the
capture's entry and exit included), in a rotated order, the ranks lined up by a barrier before each;
quoted per rank: the median over rounds of the mean step time (wall and process CPU) and of its
ratio to the plain step of the same round.

    python -m bench.precision_dist_overhead [--rounds 7] [--steps 2] [--json out.json]"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import tempfile
import time
from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from bench.precision_overhead import CFG, _load, summarise
from ditorch_precision import Capture
from ditorch_precision.arguments import cli_type, positive_int
from ditorch_precision.examples import gloo_job
from ditorch_precision.examples.hf_llama import hf_batches, make_hf_llama

VARIANTS = ("plain", "capture(all ops, stats)", "capture(all ops, stats, python hook)", "capture(all ops, full)")


def _capture(name: str, path: str):
    if name == "plain":
        return None
    return Capture(path, mode="full" if "full" in name else "stats", hook="python" if "python" in name else "auto")


def _step(ddp, opt, ids: torch.Tensor, peer: int) -> None:
    opt.zero_grad(set_to_none=True)
    sent = ddp.module.model.embed_tokens(ids).detach()
    got = torch.empty_like(sent)
    for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, sent, peer), dist.P2POp(dist.irecv, got, peer)]):
        work.wait()
    loss = ddp(input_ids=ids, labels=ids).loss + got.mean() * 0
    loss.backward()
    opt.step()


def worker(rank: int, world: int, port: int, out: str, rounds: int, steps: int) -> None:
    with gloo_job.joined(rank, world, port):
        ddp = DistributedDataParallel(make_hf_llama(CFG))
        opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
        data = hf_batches(CFG, steps, seed=rank)
        _step(ddp, opt, data[0], 1 - rank)  # warm-up, outside any capture
        times: dict[str, list[tuple[float, float]]] = {n: [] for n in VARIANTS}
        hooks = {}
        for r in range(rounds):
            for name in VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]:
                path = os.path.join(out, f"rank{rank}", "capture")
                cap = _capture(name, path)
                dist.barrier()
                t0, c0 = time.perf_counter(), time.process_time()
                with cap or nullcontext():
                    for ids in data:
                        _step(ddp, opt, ids, 1 - rank)
                times[name].append(((time.perf_counter() - t0) / steps, (time.process_time() - c0) / steps))
                if cap is not None:
                    hooks[name] = cap.hook_used
                shutil.rmtree(path, ignore_errors=True)
        with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
            json.dump({"tools": summarise(times), "hooks": hooks}, f)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=cli_type(positive_int), default=7)
    p.add_argument("--steps", type=cli_type(positive_int), default=2, help="steps per variant per round")
    p.add_argument("--json", metavar="FILE")
    a = p.parse_args(argv)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=600))
    os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "True"  # the ranks join the store served here
    out = tempfile.mkdtemp(prefix="precision-dist-bench-")
    try:
        load_before = _load()
        torch.multiprocessing.spawn(worker, args=(2, store.port, out, a.rounds, a.steps), nprocs=2)
        load_after = _load()
        ranks = []
        for rank in (0, 1):
            with open(os.path.join(out, f"rank{rank}.json")) as f:
                ranks.append(json.load(f))
    finally:
        shutil.rmtree(out, ignore_errors=True)
    print(f"{'rank':<4} {'variant':<38} {'hook':<6} {'step ms':>8} {'ratio':>7} {'range':>13} {'cpu ms':>7} "
          f"{'cpu ratio':>9}")
    for rank, result in enumerate(ranks):
        for name, row in result["tools"].items():
            print(f"{rank:<4} {name:<38} {result['hooks'].get(name, ''):<6} {row['step_ms']:8.1f} "
                  f"{row['ratio']:6.2f}x {row['ratio_min']:5.2f}-{row['ratio_max']:<5.2f}x {row['cpu_ms']:7.1f} "
                  f"{row['cpu_ratio']:8.2f}x")
    print(f"load average {load_before} -> {load_after}; {a.rounds} rounds x {a.steps} steps, 1 thread a rank")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"config": vars(CFG), "rounds": a.rounds, "steps": a.steps,
                       "load_average": [load_before, load_after], "ranks": ranks}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
