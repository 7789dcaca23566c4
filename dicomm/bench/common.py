"""What the p2p and coll workers share: the control group, rounds, records and progress lines."""
from __future__ import annotations

import datetime
import sys

import torch
import torch.distributed as dist

from dicomm.bench.endpoints import close_endpoint, make_endpoint
from dicomm.bench.stats import Record, RunConfig, format_size, summarize


def setup(rank: int, world_size: int, store, cfg: RunConfig) -> list:
    """Creates the control group (gloo, default group: barriers and bookkeeping, never measured)
    and one endpoint per measured label, in the same processes."""
    dist.init_process_group("gloo", store=dist.PrefixStore("bench/ctrl", store), rank=rank,
                            world_size=world_size,
                            timeout=datetime.timedelta(seconds=cfg.op_timeout))
    return [make_endpoint(s, store, rank, world_size, cfg.op_timeout) for s in cfg.specs]


def teardown(endpoints: list) -> None:
    dist.barrier()
    for ep in endpoints:
        close_endpoint(ep)
    dist.destroy_process_group()


def round_sizes(iters: int, rounds: int) -> list[int]:
    """Splits `iters` into at most `rounds` nearly equal positive parts."""
    rounds = max(1, min(rounds, iters))
    return [iters // rounds + (1 if i < iters % rounds else 0) for i in range(rounds)]


def all_ranks_true(flag: bool) -> bool:
    t = torch.tensor([1 if flag else 0], dtype=torch.int32)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


def make_record(ep, op: str, nbytes: int, samples_ns: list[int], scale: float, moved: float,
                world_size: int, verified: bool, **extra) -> Record:
    """`scale` turns a sample into the reported time (0.5 for half round-trips); `moved` is the byte
    count whose rate is the reported bandwidth (GB/s = 1e9 B/s at the median time)."""
    lo, med, p99 = summarize(samples_ns, scale)
    used = ep.transport_of(1) if world_size > 1 else ""  # rank 0 asks about rank 1
    extra = {"transport_requested": ep.spec.transport, **extra}
    return Record(backend=ep.spec.label, op=op, bytes=nbytes, lat_us_min=lo, lat_us_median=med,
                  lat_us_p99=p99, gbps=moved / (med * 1e3) if med > 0 else float("nan"),
                  iters=len(samples_ns), world_size=world_size,
                  transport=used or ep.spec.transport, api=ep.spec.api, verified=verified,
                  extra=extra)


def progress(cfg: RunConfig, what: str, nbytes: int, records: list[Record]) -> None:
    if not cfg.progress:
        return
    parts = ", ".join(f"{r.backend} {r.lat_us_median:.1f} us" for r in records)
    print(f"  {what:>14} {format_size(nbytes):>9}: {parts}", file=sys.stderr, flush=True)
