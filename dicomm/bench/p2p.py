"""Ping-pong between ranks 0 and 1: half round-trip latency and bandwidth per size and backend.

Rank 0 times `send; recv` with `time.perf_counter_ns`, rank 1 answers with `recv; send`. For each
size every backend first proves one exchange carried the right bytes, warms up, then the timed
iterations run in rounds with the backends alternating, a control-group barrier between blocks.
"""
from __future__ import annotations

import time

import torch

from dicomm.bench.common import (all_ranks_true, make_record, progress, round_sizes, setup,
                                       teardown)
from dicomm.bench.stats import RunConfig


def pattern(nbytes: int, seed: int) -> torch.Tensor:
    """A byte pattern that differs per sender and per offset (period 251, a prime)."""
    period = min(nbytes, 251)
    base = ((torch.arange(period, dtype=torch.int32) * 7 + 31 * seed + 1) % 251).to(torch.uint8)
    return base.repeat((nbytes + period - 1) // period)[:nbytes].contiguous()


def pingpong(ep, sbuf, rbuf, rank: int, iters: int) -> list[int]:
    samples = []
    clock = time.perf_counter_ns
    if ep.spec.backend == "memcpy":
        if rank == 0:  # two copies, as a round trip moves the bytes twice
            for _ in range(iters):
                t0 = clock()
                rbuf.copy_(sbuf)
                sbuf.copy_(rbuf)
                samples.append(clock() - t0)
        return samples
    if ep.spec.api == "native":  # the same isend/irecv + wait calls, looped in C++
        if rank > 1:
            return samples
        from dicomm import _C_bench
        return list(_C_bench._pingpong(ep.comm, 1 - rank, sbuf.data_ptr(), rbuf.data_ptr(), sbuf.numel(), iters,
                                 rank == 0, timeout_s=ep.comm.timeout_s))
    if rank == 0:
        for _ in range(iters):
            t0 = clock()
            ep.send(sbuf, 1)
            ep.recv(rbuf, 1)
            samples.append(clock() - t0)
    elif rank == 1:
        for _ in range(iters):
            ep.recv(rbuf, 0)
            ep.send(sbuf, 0)
    return samples


def verify(ep, sbuf, rbuf, expect, rank: int) -> bool:
    """One untimed exchange; True when this rank received exactly the peer's pattern."""
    if rank > 1 or (ep.spec.backend == "memcpy" and rank != 0):
        return True
    rbuf.zero_()
    pingpong(ep, sbuf, rbuf, rank, 1)
    return torch.equal(rbuf, sbuf if ep.spec.backend == "memcpy" else expect)


def run(rank: int, world_size: int, store, cfg: RunConfig) -> list[dict]:
    endpoints = setup(rank, world_size, store, cfg)
    import torch.distributed as dist

    out = []
    for nbytes in cfg.sizes:
        sbuf = pattern(nbytes, seed=rank)
        expect = pattern(nbytes, seed=1 - rank) if rank < 2 else sbuf
        rbuf = torch.empty(nbytes, dtype=torch.uint8)
        iters, warm = cfg.plan.iters_for(nbytes), cfg.plan.warmup_for(nbytes)
        ok, samples = {}, {ep.spec.label: [] for ep in endpoints}
        for ep in endpoints:
            dist.barrier()
            ok[ep.spec.label] = verify(ep, sbuf, rbuf, expect, rank)
            pingpong(ep, sbuf, rbuf, rank, warm)
        for n in round_sizes(iters, cfg.rounds):
            for ep in endpoints:
                dist.barrier()
                samples[ep.spec.label] += pingpong(ep, sbuf, rbuf, rank, n)
        ok = {label: all_ranks_true(v) for label, v in ok.items()}
        if rank == 0:
            recs = [make_record(ep, "p2p", nbytes, samples[ep.spec.label], 0.5, nbytes,
                                world_size, ok[ep.spec.label]) for ep in endpoints]
            progress(cfg, "p2p", nbytes, recs)
            out += [r.to_json() for r in recs]
        del sbuf, rbuf, expect
    teardown(endpoints)
    return out
