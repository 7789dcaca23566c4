"""A 64 MiB fp32 all_reduce on dicomm against its memory-traffic bound, at 2, 3 and 4 ranks.

The bound (derivation in docs/benchmarks.md, "all_reduce against its memory-traffic bound"): with p
ranks of N bytes each, an all_reduce must at least read every rank's input once and write every
rank's output once, and move what it reduces between processes. With blocks of N/p reduced by
their owner, chunks small enough to stay in cache between the copy that brings them and the sum
that reads them, and the result copied back, each rank's memory traffic is at least
(3p - 1) / p * N bytes, so the whole host moves (3p - 1) * N. The host's memory bandwidth is measured
in the same processes at the same moment: all p ranks copy N bytes at once (2N of traffic each),
taking t_copy; the bound is then (3p - 1) * N / (2pN / t_copy) = (3p - 1) / (2p) * t_copy.

Each sample is the slowest rank's time of one call (the ranks start together after a barrier);
reported: medians, and the CPU time and context switches (voluntary: a wait that slept; involuntary:
the scheduler took the CPU) of all ranks (every thread) per call beside the wall time. `--algorithm
all` runs the push algorithm (the default on one host), the push algorithm with pairwise combines
instead of one fused pass, the push algorithm with work stealing, the ring and the direct algorithm back
to back (DICOMM_ALL_REDUCE_PUSH, DICOMM_ALL_REDUCE_FUSED, DICOMM_ALL_REDUCE_STEAL,
DICOMM_ALL_REDUCE_DIRECT_RANKS), so they are compared under the same load; a comma list runs those named.
`--thp` backs the ranks' tensors with transparent huge pages (torch's THP_MEM_ALLOC_ENABLE=1):
cross-memory attach then pins one page per 2 MiB instead of 512 (the push algorithm folds its buffer
into huge pages itself).

    python -m bench.dicomm_allreduce_bound [--ranks 2,3,4] [--iters 20] [--repeat 3] [--contention 1]
        [--algorithm push|push-pairwise|push-steal|ring|direct|all|A,B,...] [--thp] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from dataclasses import dataclass

MIB = 1 << 20


@dataclass
class Config:
    nbytes: int
    iters: int
    warmup: int
    op_timeout: float = 120.0


def _usage() -> tuple[float, int, int]:
    """CPU seconds, voluntary and involuntary context switches of every thread of this rank."""
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime, u.ru_nvcsw, u.ru_nivcsw


def _slowest(times: list[float]):
    import torch
    import torch.distributed as dist

    t = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def _rank(rank: int, world: int, store, cfg: Config) -> dict:
    import datetime

    import torch
    import torch.distributed as dist

    dist.init_process_group("dicomm", store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=cfg.op_timeout))
    count = cfg.nbytes // 4
    buf = torch.full((count,), float(rank + 1))
    src, dst = torch.rand(count), torch.empty(count)
    copies, reduces, cpu, vcsw, ivcsw = [], [], [], [], []
    for i in range(cfg.warmup + cfg.iters):
        dist.barrier()
        t0 = time.perf_counter()
        dst.copy_(src)  # every rank at once: what the host's memory gives p concurrent copies
        t1 = time.perf_counter()
        dist.barrier()
        u0, t2 = _usage(), time.perf_counter()
        dist.all_reduce(buf)
        t3, u1 = time.perf_counter(), _usage()
        if i >= cfg.warmup:
            copies.append(t1 - t0)
            reduces.append(t3 - t2)
            cpu.append(u1[0] - u0[0])
            vcsw.append(u1[1] - u0[1])
            ivcsw.append(u1[2] - u0[2])
        buf.fill_(float(rank + 1))  # sums never grow; not timed
    exact = bool(torch.all(buf == float(rank + 1)))  # refilled: check one last call's result instead
    dist.all_reduce(buf)
    exact = exact and bool(torch.all(buf == float(world * (world + 1) // 2)))
    from dicomm.backend import communicator_of

    # Chunks that ranks done with their own block took from a late one, per call (all ranks).
    stolen = communicator_of(dist.group.WORLD).stats()["all_reduce_chunks_stolen"] / (cfg.warmup + cfg.iters + 1)
    copies, reduces = _slowest(copies), _slowest(reduces)
    cpu_t = torch.tensor([cpu, vcsw, ivcsw, [stolen] * len(cpu)], dtype=torch.float64)
    dist.all_reduce(cpu_t)  # all ranks' CPU time and context switches per call
    ok = torch.tensor([int(exact)])
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    dist.destroy_process_group()
    cpu_s, vcsw_n, ivcsw_n, stolen_n = cpu_t.tolist()
    return {"copy_s": copies, "all_reduce_s": reduces, "cpu_s": cpu_s, "vcsw": vcsw_n, "ivcsw": ivcsw_n,
            "stolen": stolen_n, "exact": bool(ok.item())}


def bound_factor(p: int) -> float:
    """The bound over t_copy: (3p - 1) N of traffic at 2pN per t_copy."""
    return (3 * p - 1) / (2 * p)


# The knobs that pick the algorithm of a large all_reduce (docs/dicomm-config.md).
_KNOBS = {"push": {"DICOMM_ALL_REDUCE_PUSH": "1", "DICOMM_ALL_REDUCE_STEAL": "0",
                   "DICOMM_ALL_REDUCE_FUSED": "1", "DICOMM_ALL_REDUCE_DIRECT_RANKS": "0"},
          "push-pairwise": {"DICOMM_ALL_REDUCE_PUSH": "1", "DICOMM_ALL_REDUCE_STEAL": "0",
                            "DICOMM_ALL_REDUCE_FUSED": "0", "DICOMM_ALL_REDUCE_DIRECT_RANKS": "0"},
          "push-steal": {"DICOMM_ALL_REDUCE_PUSH": "1", "DICOMM_ALL_REDUCE_STEAL": "1",
                         "DICOMM_ALL_REDUCE_FUSED": "1", "DICOMM_ALL_REDUCE_DIRECT_RANKS": "0"},
          "ring": {"DICOMM_ALL_REDUCE_PUSH": "0", "DICOMM_ALL_REDUCE_DIRECT_RANKS": "0"},
          "direct": {"DICOMM_ALL_REDUCE_PUSH": "0", "DICOMM_ALL_REDUCE_DIRECT_RANKS": "8"}}
_MEDIANS = ("copy_s", "all_reduce_s", "cpu_s", "vcsw", "ivcsw", "stolen")


def measure(ranks: list[int], cfg: Config, contention: int, repeat: int,
            algorithms: tuple[str, ...] = ("push",)) -> list[dict]:
    """One row per algorithm, rank count and repetition (they alternate within a repetition, in turns
    forward and backward)."""
    from dicomm.bench.contention import cpu_hogs
    from dicomm.bench.launch import machine_info, run_ranks

    rows = []
    saved = {k: os.environ.get(k) for knobs in _KNOBS.values() for k in knobs}
    try:
        with cpu_hogs(contention):
            for rep in range(repeat):
                for p in ranks:
                    # Every other repetition in reverse, so that no algorithm always runs first.
                    for algorithm in algorithms if rep % 2 == 0 else algorithms[::-1]:
                        for k in saved:  # forked ranks read them
                            os.environ.pop(k, None)
                        os.environ.update(_KNOBS[algorithm])
                        out = run_ranks(_rank, p, cfg, timeout=cfg.op_timeout * 4)
                        med = {k: statistics.median(out[k]) for k in _MEDIANS}
                        bound = bound_factor(p) * med["copy_s"]
                        rows.append({"algorithm": algorithm, "thp": os.environ.get("THP_MEM_ALLOC_ENABLE") == "1",
                                     "ranks": p, "repetition": rep, "bytes": cfg.nbytes,
                                     "iters": cfg.iters, "contention": contention, "copy_ms": med["copy_s"] * 1e3,
                                     "bound_ms": bound * 1e3, "all_reduce_ms": med["all_reduce_s"] * 1e3,
                                     "cpu_ms_all_ranks": med["cpu_s"] * 1e3, "vcsw_all_ranks": med["vcsw"],
                                     "ivcsw_all_ranks": med["ivcsw"], "chunks_stolen_per_call": med["stolen"],
                                     "ratio": med["all_reduce_s"] / bound,
                                     "exact": out["exact"], "machine": machine_info()})
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return rows


def table(rows: list[dict]) -> str:
    """Per algorithm and rank count: the medians over the repetitions, and the range of the ratio."""
    lines = ["| algorithm | ranks | hogs/core | runs | copy (all ranks at once) ms | bound ms | all_reduce ms "
             "| CPU ms (all ranks) | context switches vol./invol. (all ranks) | chunks stolen per call "
             "| all_reduce / bound (range) | load (1 min) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    def label(r: dict) -> str:
        return r.get("algorithm", "push") + (" + THP" if r.get("thp") else "")

    for algorithm, p in sorted({(label(r), r["ranks"]) for r in rows}):
        mine = [r for r in rows if label(r) == algorithm and r["ranks"] == p]
        med = {k: statistics.median(r.get(k, 0) for r in mine)
               for k in ("copy_ms", "bound_ms", "all_reduce_ms", "cpu_ms_all_ranks", "vcsw_all_ranks",
                         "ivcsw_all_ranks", "chunks_stolen_per_call", "ratio")}
        ratios = [r["ratio"] for r in mine]
        loads = [r["machine"]["loadavg_1_5_15min"][0] for r in mine]
        lines.append(f"| {algorithm} | {p} | {mine[0]['contention']} | {len(mine)} | {med['copy_ms']:.1f} | "
                     f"{med['bound_ms']:.1f} | {med['all_reduce_ms']:.1f} | {med['cpu_ms_all_ranks']:.1f} | "
                     f"{med['vcsw_all_ranks']:.0f} / {med['ivcsw_all_ranks']:.0f} | "
                     f"{med['chunks_stolen_per_call']:.1f} | {med['ratio']:.2f} "
                     f"({min(ratios):.2f}-{max(ratios):.2f}) | {min(loads)}-{max(loads)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="2,3,4", help="comma list of rank counts (default 2,3,4)")
    ap.add_argument("--mib", type=int, default=64, help="buffer size in MiB (default 64)")
    ap.add_argument("--iters", type=int, default=20, help="timed calls per rank count (default 20)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed calls first (default 3)")
    ap.add_argument("--contention", type=int, default=0, help="busy processes per CPU (default 0)")
    ap.add_argument("--repeat", type=int, default=3, help="repetitions of the whole measurement (default 3)")
    ap.add_argument("--algorithm", default="push",
                    help=f"the all_reduce algorithm, or a comma list of them run back to back: {', '.join(_KNOBS)} "
                         "(push-steal: with work stealing), or all (default push, the engine's default on one host)")
    ap.add_argument("--thp", action="store_true",
                    help="the ranks' tensors in transparent huge pages (THP_MEM_ALLOC_ENABLE=1)")
    ap.add_argument("--json", help="write the rows as JSON")
    args = ap.parse_args(argv)
    try:
        ranks = [int(x) for x in args.ranks.split(",")]
    except ValueError:
        ap.error(f"--ranks wants a comma list of integers, got {args.ranks!r}")
    if any(p < 2 for p in ranks) or args.mib < 1 or args.iters < 1 or args.warmup < 0 or args.contention < 0 \
            or args.repeat < 1:
        ap.error("--ranks >= 2 each, --mib >= 1, --iters >= 1, --warmup >= 0, --contention >= 0, --repeat >= 1")
    cfg = Config(args.mib * MIB, args.iters, args.warmup)
    if args.thp:  # read by torch's CPU allocator once, at its first allocation: before torch is imported
        os.environ["THP_MEM_ALLOC_ENABLE"] = "1"
    algorithms = tuple(_KNOBS) if args.algorithm == "all" else tuple(args.algorithm.split(","))
    if not all(a in _KNOBS for a in algorithms):
        ap.error(f"--algorithm wants {', '.join(_KNOBS)}, a comma list of them, or all; got {args.algorithm!r}")
    rows = measure(ranks, cfg, args.contention, args.repeat, algorithms)
    print(table(rows))
    if not all(r["exact"] for r in rows):
        print("an all_reduce result was wrong", file=sys.stderr)
        return 1
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
