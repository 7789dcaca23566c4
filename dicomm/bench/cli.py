"""dicomm-bench: dicomm against gloo, side by side in the same processes, on this host.

  dicomm-bench p2p   ping-pong half round-trip latency and bandwidth, 8 B .. 256 MiB, 2 ranks
  dicomm-bench coll  all_reduce / all_gather / reduce_scatter / all_to_all, 1 KiB .. 256 MiB
  dicomm-bench targets  the issue's four targets (p2p 8 B and 64 MiB, all_reduce 64 MiB)
  dicomm-bench show FILE.json...  tables (and targets) of earlier runs

--contention N runs N busy processes per CPU during any measurement (a loaded host).

Each run prints a table; --json writes one record per (backend, op, bytes), --plot the curves.
"""
from __future__ import annotations

import argparse
import os
import sys

from dicomm.bench.contention import cpu_hogs
from dicomm.bench.run import run_command, run_targets, show

_DEFAULTS = {  # kind: (min, max, iters, warmup, budget, min_iters, apis)
    "p2p": ("8", "256M", 1000, 50, "1G", 8, "torch,raw"),
    "coll": ("1K", "256M", 200, 20, "1G", 5, "torch"),
}


def _contention(p: argparse.ArgumentParser) -> None:
    p.add_argument("--contention", type=int, default=0, metavar="N",
                   help="N busy processes per CPU run during the measurement, started and stopped by the "
                        "benchmark (default 0: a quiet host)")


def _common(p: argparse.ArgumentParser, kind: str) -> None:
    _contention(p)
    lo, hi, iters, warm, budget, min_iters, apis = _DEFAULTS[kind]
    p.add_argument("--backends", default=None,
                   help="comma list of dicomm,gloo (default: both; dicomm skipped with a warning "
                        "when it cannot be imported)")
    p.add_argument("--api", default=apis, help=f"dicomm APIs: torch,raw,native (default {apis}); native: p2p's "
                   "ping-pong looped in C++ over the raw communicator")
    p.add_argument("--min-bytes", default=lo, help=f"smallest size (default {lo})")
    p.add_argument("--max-bytes", default=hi, help=f"largest size (default {hi})")
    p.add_argument("--step", type=int, default=2, help="size multiplier (default 2)")
    p.add_argument("--iters", type=int, default=iters,
                   help=f"timed iterations of small sizes (default {iters}); big sizes get fewer, "
                        f"down to {min_iters}, so that each moves about --budget bytes")
    p.add_argument("--warmup", type=int, default=warm, help=f"warm-up iterations (default {warm})")
    p.add_argument("--budget", default=budget,
                   help=f"bytes per size and backend (default {budget})")
    p.add_argument("--rounds", type=int, default=10,
                   help="timed iterations are split into rounds, backends alternating (default 10)")
    p.add_argument("--transport", default=os.environ.get("DICOMM_TRANSPORT", "auto"),
                   choices=["auto", "shm", "tcp", "verbs"], help="transport of the dicomm groups "
                   "(default: $DICOMM_TRANSPORT or auto); labels become dicomm-<transport>")
    p.add_argument("--quick", action="store_true", help="a few small sizes and iterations")
    p.add_argument("--targets", action="store_true",
                   help="also measure a dicomm group forced to tcp, then print the issue's targets")
    p.add_argument("--json", metavar="FILE", help="write the records as JSON")
    p.add_argument("--plot", metavar="FILE.png", help="draw latency and bandwidth curves")
    p.add_argument("--markdown", action="store_true", help="print tables as markdown")
    p.add_argument("--timeout", type=float, default=1800.0, help="deadline of the whole run (s)")
    p.add_argument("--op-timeout", type=float, default=300.0,
                   help="timeout of every group, store and wait (s)")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(kind=kind, min_iters=min_iters)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="dicomm-bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("p2p", help="point-to-point ping-pong between 2 ranks")
    _common(p, "p2p")
    p.add_argument("--no-memcpy", dest="memcpy", action="store_false",
                   help="leave out the 'memcpy' reference (rank 0 copying the buffer there and "
                        "back locally: the ceiling of a single-copy transport, measured alongside)")
    c = sub.add_parser("coll", help="collectives: time and bus bandwidth")
    _common(c, "coll")
    c.add_argument("--world-size", type=int, default=2, help="ranks (default 2)")
    c.add_argument("--ops", default="all_reduce,all_gather,reduce_scatter,all_to_all",
                   help="comma list of collectives (default: all four)")
    t = sub.add_parser("targets", help="measure and print the issue's four targets")
    t.add_argument("--iters", type=int, default=2000, help="iterations at 8 B (default 2000)")
    t.add_argument("--budget", default="4G", help="bytes per 64 MiB measurement (default 4G)")
    t.add_argument("--rounds", type=int, default=10, help="alternation rounds (default 10)")
    t.add_argument("--from-json", nargs="+", metavar="FILE", help="evaluate saved runs instead")
    t.add_argument("--json", metavar="FILE", help="write the records as JSON")
    t.add_argument("--markdown", action="store_true", help="print tables as markdown")
    t.add_argument("--timeout", type=float, default=1800.0, help="deadline of each run (s)")
    t.add_argument("--op-timeout", type=float, default=300.0, help="timeout of every wait (s)")
    t.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    _contention(t)
    s = sub.add_parser("show", help="print the tables of saved JSON files")
    s.add_argument("files", nargs="+")
    s.add_argument("--sizes", default=None, help="comma list of sizes to show, e.g. 8,4K,1M,64M")
    s.add_argument("--markdown", action="store_true", help="print tables as markdown")
    s.add_argument("--targets", action="store_true", help="also print the targets")
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    command = "dicomm-bench " + " ".join(argv)
    if args.cmd == "show":
        return show(args)
    if args.contention < 0:
        parser().error(f"--contention must be a non-negative number of busy processes per CPU, got {args.contention}")
    with cpu_hogs(args.contention):
        if args.cmd == "targets":
            return run_targets(args, command)
        return run_command(args, command)


if __name__ == "__main__":
    sys.exit(main())
