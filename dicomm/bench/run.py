"""The subcommands of dicomm-bench: choose the backends, run the ranks, report."""
from __future__ import annotations

import sys

from dicomm.bench import coll as coll_bench
from dicomm.bench import p2p as p2p_bench
from dicomm.bench import report
from dicomm.bench.endpoints import MEMCPY, dicomm_status, make_specs
from dicomm.bench.launch import BenchFailure, machine_info, run_ranks
from dicomm.bench.stats import MIB, IterPlan, RunConfig, parse_size, size_range

_WORKERS = {"p2p": p2p_bench.run, "coll": coll_bench.run}



def make_config(args, specs: list, kind: str, sizes: list[int] | None = None,
                ops: tuple[str, ...] = ()) -> RunConfig:
    """The RunConfig of a p2p/coll run from parsed arguments (`sizes` overrides the range)."""
    n = getattr(args, "world_size", 2) if kind == "coll" else 2
    if sizes is None:
        if getattr(args, "quick", False):
            sizes = [8, 4096, 65536] if kind == "p2p" else [1024, 65536]
        else:
            sizes = size_range(parse_size(str(args.min_bytes)), parse_size(str(args.max_bytes)),
                               args.step, align=1 if kind == "p2p" else 4 * n)
    if getattr(args, "quick", False):
        plan = IterPlan(iters=20 if kind == "p2p" else 10, warmup=2, budget=64 * MIB, min_iters=2)
    else:
        plan = IterPlan(iters=args.iters, warmup=getattr(args, "warmup", 50),
                        budget=parse_size(str(args.budget)),
                        min_iters=getattr(args, "min_iters", 8))
    rounds = 2 if getattr(args, "quick", False) else args.rounds
    return RunConfig(kind=kind, specs=specs, sizes=sizes, plan=plan, rounds=rounds, ops=ops,
                     op_timeout=args.op_timeout, progress=not args.quiet)


def _split(text: str, allowed: tuple[str, ...], what: str) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in items if x not in allowed]
    if bad or not items:
        raise SystemExit(f"dicomm-bench: bad {what} {text!r}: expected a comma list of "
                         f"{', '.join(allowed)}")
    return items


def _warn(msg: str) -> None:
    print(f"dicomm-bench: {msg}", file=sys.stderr, flush=True)


def resolve_specs(backends_arg: str | None, api_arg: str, transport: str, kind: str,
                  extra_tcp: bool) -> list:
    """The measured labels; dicomm is dropped with a warning when it is not usable and was not
    asked for explicitly (asked for explicitly, it is an error)."""
    explicit = backends_arg is not None
    backends = _split(backends_arg or "dicomm,gloo", ("dicomm", "gloo"), "--backends")
    apis = _split(api_arg, ("torch", "raw", "native"), "--api")
    if kind == "coll" and {"raw", "native"} & set(apis):
        _warn("coll measures through torch.distributed only; ignoring --api raw/native")
        apis = [a for a in apis if a == "torch"] or ["torch"]
    if "dicomm" in backends:
        why = dicomm_status()
        if why and explicit:
            raise SystemExit(f"dicomm-bench: the dicomm backend is not usable here ({why}); "
                             f"build it (make setup) or pass --backends gloo")
        if why:
            _warn(f"dicomm skipped, not usable yet ({why}); measuring gloo only")
            backends.remove("dicomm")
    if not backends:
        raise SystemExit("dicomm-bench: nothing to measure")
    return make_specs(backends, apis, transport, extra_tcp)


def _execute(cfg, world_size: int, timeout: float) -> list[dict]:
    labels = ", ".join(s.label for s in cfg.specs)
    _warn(f"{cfg.kind}: {world_size} ranks, {len(cfg.sizes)} sizes, measuring {labels}")
    try:
        return run_ranks(_WORKERS[cfg.kind], world_size, cfg, timeout)
    except BenchFailure as exc:
        raise SystemExit(str(exc)) from None


def _finish(args, command: str, kind: str, records: list[dict], show_targets: bool) -> int:
    md = getattr(args, "markdown", False)
    print(report.table(records, markdown=md))
    machine = machine_info()
    print(f"\nmachine: {machine['nproc']} cores, {machine['cpu']}, {machine['mem_gib']} GiB, "
          f"kernel {machine['kernel']}, torch {machine['torch']}; load average at the end "
          f"(1, 5, 15 min): {machine['loadavg_1_5_15min']}")
    if getattr(args, "json", None):
        report.write_json(args.json, kind, command, machine, records)
        _warn(f"wrote {len(records)} records to {args.json}")
    if getattr(args, "plot", None):
        report.plot(args.plot, records, f"{command}  ({machine['nproc']} cores, {machine['cpu']})")
        _warn(f"wrote {args.plot}")
    if show_targets:
        print()
        report.print_targets(records, markdown=md)
    bad = [r for r in records if not r["verified"]]
    for r in bad:
        _warn(f"ERROR: {r['backend']} delivered wrong data in {r['op']} of {r['bytes']} bytes")
    return 2 if bad else 0


def run_command(args, command: str) -> int:
    kind = args.kind
    n = args.world_size if kind == "coll" else 2
    if n < 2:
        raise SystemExit("dicomm-bench: --world-size must be at least 2")
    ops: tuple[str, ...] = ()
    if kind == "coll":
        ops = tuple(_split(args.ops, coll_bench.OPS, "--ops"))
    specs = resolve_specs(args.backends, args.api, args.transport, kind, args.targets)
    if kind == "p2p" and args.memcpy:
        specs.append(MEMCPY)
    cfg = make_config(args, specs, kind, ops=ops)
    records = _execute(cfg, n, args.timeout)
    return _finish(args, command, kind, records, args.targets)


def run_targets(args, command: str) -> int:
    """p2p at 8 B and 64 MiB (dicomm, dicomm-tcp, gloo) and all_reduce at 64 MiB (dicomm, gloo)."""
    if args.from_json:
        records = report.read_records(args.from_json)
        print(report.table(records, sizes=[8, 64 * MIB], markdown=args.markdown) + "\n")
        report.print_targets(records, markdown=args.markdown)
        return 0
    args.warmup, args.min_iters, args.quick = 50, 8, False
    p2p = make_config(args, resolve_specs(None, "torch", "auto", "p2p", True) + [MEMCPY], "p2p",
                      sizes=[8, 64 * MIB])
    coll = make_config(args, resolve_specs(None, "torch", "auto", "coll", False), "coll",
                       sizes=[64 * MIB], ops=("all_reduce",))
    records = _execute(p2p, 2, args.timeout) + _execute(coll, 2, args.timeout)
    return _finish(args, command, "targets", records, True)


def show(args) -> int:
    records = report.read_records(args.files)
    sizes = [parse_size(s) for s in args.sizes.split(",")] if args.sizes else None
    print(report.table(records, sizes=sizes, markdown=args.markdown))
    if args.targets:
        print()
        report.print_targets(records, markdown=args.markdown)
    return 0
