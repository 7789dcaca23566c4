"""Collectives through torch.distributed: time and bus bandwidth per op, size and backend.

Conventions of nccl-tests: `bytes` is the all_reduce buffer, the all_gather output, the
reduce_scatter input and the all_to_all buffer of one rank; algbw = bytes / time; busbw = algbw *
2(n-1)/n for all_reduce and algbw * (n-1)/n for the others. `gbps` in the records is busbw. Every
sample is the slowest rank's time of that iteration. Data are float32, the reduction SUM (gloo has
no AVG).
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from dicomm.bench.common import (all_ranks_true, make_record, progress, round_sizes, setup,
                                       teardown)
from dicomm.bench.stats import RunConfig

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def bus_factor(op: str, n: int) -> float:
    return 2.0 * (n - 1) / n if op == "all_reduce" else (n - 1) / n


class Case:
    """Buffers and call of one op at one size (shared by every backend of that size)."""

    def __init__(self, op: str, nbytes: int, rank: int, n: int):
        self.op, self.rank, self.n = op, rank, n
        count = nbytes // 4
        small = count // n
        self.inp = torch.zeros(small if op == "all_gather" else count)
        self.out = torch.zeros(small if op == "reduce_scatter" else count)

    def call(self, group) -> None:
        if self.op == "all_reduce":
            dist.all_reduce(self.inp, op=dist.ReduceOp.SUM, group=group)
        elif self.op == "all_gather":
            _gather(self.out, self.inp, group=group)
        elif self.op == "reduce_scatter":
            _reduce_scatter(self.out, self.inp, op=dist.ReduceOp.SUM, group=group)
        else:
            dist.all_to_all_single(self.out, self.inp, group=group)

    def verify(self, group) -> bool:
        """One untimed call on rank-dependent data; True when this rank's result is exact.
        The buffers are zeroed again afterwards so timed sums never overflow."""
        n, r = self.n, self.rank
        total = n * (n + 1) / 2
        self.out.fill_(-1.0)
        if self.op == "all_to_all":
            self.inp.view(n, -1).copy_((torch.arange(n) + r * n + 1.0).unsqueeze(1))
        else:
            self.inp.fill_(r + 1.0)
        self.call(group)
        if self.op == "all_reduce":
            ok = bool(torch.all(self.inp == total))
        elif self.op == "all_gather":
            ok = torch.equal(self.out.view(n, -1),
                             (torch.arange(n) + 1.0).unsqueeze(1).expand(n, self.inp.numel()))
        elif self.op == "reduce_scatter":
            ok = bool(torch.all(self.out == total))
        else:
            want = (torch.arange(n) * n + r + 1.0).unsqueeze(1)
            ok = torch.equal(self.out.view(n, -1), want.expand(n, self.out.numel() // n))
        self.inp.zero_()
        self.out.zero_()
        return ok


def timed(case: Case, group, iters: int) -> list[int]:
    clock, samples = time.perf_counter_ns, []
    for _ in range(iters):
        t0 = clock()
        case.call(group)
        samples.append(clock() - t0)
    return samples


def slowest(samples: list[int]) -> list[int]:
    """Per iteration, the slowest rank's time (a MAX over the control group)."""
    t = torch.tensor(samples, dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def run(rank: int, world_size: int, store, cfg: RunConfig) -> list[dict]:
    endpoints = setup(rank, world_size, store, cfg)
    out = []
    for op in cfg.ops:
        for nbytes in cfg.sizes:
            case = Case(op, nbytes, rank, world_size)
            iters, warm = cfg.plan.iters_for(nbytes), cfg.plan.warmup_for(nbytes)
            ok, samples = {}, {ep.spec.label: [] for ep in endpoints}
            for ep in endpoints:
                dist.barrier()
                ok[ep.spec.label] = all_ranks_true(case.verify(ep.group))
                timed(case, ep.group, warm)
            for n in round_sizes(iters, cfg.rounds):
                for ep in endpoints:
                    dist.barrier()
                    samples[ep.spec.label] += timed(case, ep.group, n)
            samples = {label: slowest(s) for label, s in samples.items()}
            if rank == 0:
                f = bus_factor(op, world_size)
                recs = [make_record(ep, op, nbytes, samples[ep.spec.label], 1.0, nbytes * f,
                                    world_size, ok[ep.spec.label], dtype="float32")
                        for ep in endpoints]
                for r in recs:
                    r.extra["busbw_gbps"] = r.gbps
                    r.extra["algbw_gbps"] = r.gbps / f if f else float("nan")
                progress(cfg, op, nbytes, recs)
                out += [r.to_json() for r in recs]
            del case
    teardown(endpoints)
    return out
