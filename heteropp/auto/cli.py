"""`heteroauto`: plan, simulate, compare and profile."""
from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import replace
from typing import Any

from ..argtypes import at_least, positive
from ..plan import SCHEDULES, Plan
from ..spec import InfeasibleError, SpecError
from .limits import DEFAULT_WORK, IDLE_MODES

log = logging.getLogger("heteroauto")


def _progress(msg: str) -> None:
    print(f"[heteroauto] {msg}", file=sys.stderr, flush=True)


def _add_inputs(p: argparse.ArgumentParser, sizes: bool = False) -> None:
    p.add_argument("--cluster", required=True, help="cluster spec (YAML/JSON)")
    p.add_argument("--model", required=True, help="model preset (tiny, h2-100b) or spec file")
    p.add_argument("--train", required=True, help="training spec (YAML/JSON)")
    p.add_argument("--profile", action="append", help="profile JSON from `heteroauto profile` (default: analytic "
                   "from chip specs); given again for each file of other chip types (`heteroauto profile --chip`)"
                   + ("; with --micro-batch-sizes, for each size searched" if sizes else ""))
    p.add_argument("--seq-len", type=at_least(1), help="training sequence length (default: the model's; for a "
                   "HuggingFace config its max_position_embeddings), as `heteropp run --seq-len` trains")
    p.add_argument("--group-size", type=at_least(1), default=128, help="chips per group in the two-stage refinement")


def _writable(path: str | None, flag: str) -> None:
    """An output path checked before any work: its directory exists and takes a new file, and the path is
    no directory (an unwritable --json failed with a traceback after the whole search)."""
    if path is None:
        return
    import os
    from pathlib import Path
    p = Path(path)
    folder = p.parent if str(p.parent) else Path(".")
    want = "a file path in an existing, writable directory"
    if p.is_dir():
        raise SpecError(path, flag, f"{path} is a directory", want)
    if not folder.is_dir():
        raise SpecError(path, flag, f"directory {folder} does not exist", want)
    if not os.access(folder, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise SpecError(path, flag, f"{path} is not writable by this user", want)


def cmd_plan(a: argparse.Namespace) -> int:
    from .explain import explain, table
    from .front_door import Budget
    from .front_door import plan as plan_of
    from .planning import load_problem
    _writable(a.json, "--json")
    profiles = a.profile or []
    if a.per_replica and a.micro_batch_sizes is not None:
        raise SpecError("<command line>", "--per-replica", "with --micro-batch-sizes",
                        "one of the two: replica groups are planned at the training spec's micro-batch size")
    # with --micro-batch-sizes, _sized prices each size with its own profiles
    pb = load_problem(a.cluster, a.model, a.train, None if a.micro_batch_sizes else profiles, a.seq_len)
    budget = Budget(work=a.work_budget, time_cap_s=a.time_cap, baselines=a.baselines, idle=a.idle,
                    group_size=a.group_size)
    if a.micro_batch_sizes is not None:
        out = _sized(a, pb, budget)
    else:
        out = plan_of(pb, budget, a.algo, _progress if a.progress else None)
    plan, res = out.plan, out.search
    if a.per_replica:
        from .replicas import best_per_replica, describe
        joined = best_per_replica(pb, replace(budget, baselines=False))
        if joined is not None and joined.iteration_time_s < plan.iteration_time_s:
            joined.search_time_s = plan.search_time_s
            print(describe(joined))
            if a.json:
                joined.save(a.json)
                print(f"wrote {a.json} (replica groups: `heteropp run` trains them)")
            return 0
        print("per-replica: no split of the chip types into replica groups is faster than one stage list")
    print(table(plan))
    if res.bounded:
        gap = ""
        if res.objective_s and res.lower_bound_s:  # how far from exact: the plan's objective over the bound
            gap = f"; the returned plan is at most {100 * (res.objective_s / res.lower_bound_s - 1):.1f}% above it"
        print(f"bounded search ({'; '.join(res.bounded)}): no plan's cost-model time is below "
              f"{res.lower_bound_s:.4f} s{gap}")
    if a.explain:
        print(explain(plan, res))
    if a.json:
        plan.save(a.json)
        print(f"wrote {a.json}")
    return 0


def cmd_simulate(a: argparse.Namespace) -> int:
    from ..schedules import ScheduleError, kind, missing_params
    from .plan_sim import plan_stages, schedule_params, simulate_plan
    from .planning import load_problem, make_problem
    for path, flag in ((a.json, "--json"), (a.png, "--png"), (a.write_plan, "--write-plan")):
        _writable(path, flag)
    plan = Plan.load(a.plan)
    pb = load_problem(a.cluster, a.model, a.train, a.profile, a.seq_len)
    if plan.zero1 != pb.train.zero1:  # price the plan as `heteropp run --plan` trains it: with the plan's zero1
        print(f"heteroauto: the plan records zero1: {str(plan.zero1).lower()}, the training spec says "
              f"{str(pb.train.zero1).lower()}: simulating the plan's", file=sys.stderr)
        pb = make_problem(pb.cluster, pb.model, replace(pb.train, zero1=plan.zero1), pb.cm.profile)
    m = pb.model
    plan.validate(a.plan, num_layers=m.layers, heads=m.heads, kv_heads=m.kv_heads, ffn=m.ffn, vocab=m.vocab,
                  available={c.name: c.count for c in pb.cluster.chips},
                  nodes={c.name: c.nodes for c in pb.cluster.chips if c.nodes})
    if plan.replicas:
        return _simulate_groups(a, pb, plan)
    name = a.schedule or plan.schedule
    if name != plan.schedule:
        plan.schedule, plan.schedule_params = name, schedule_params(pb.cm, plan_stages(plan), plan.dp, name)
    elif kind(name).params and not plan.schedule_params:
        plan.schedule_params = schedule_params(pb.cm, plan_stages(plan), plan.dp, name)
    if missing := missing_params(name, plan.schedule_params):
        raise SpecError(a.plan, "schedule_params", f"schedule {name!r} needs {missing[0]}, which the plan lacks "
                        "and no cost derives", f"a plan written for {name!r}")
    try:
        r = simulate_plan(pb.cm, plan, keep_timeline=bool(a.png))
    except ScheduleError as e:  # the schedule cannot run this plan (interleaved: micro-batches vs stages)
        raise SpecError(a.plan, "stages", f"schedule {name!r} cannot run the plan: {e}",
                        f"a plan that {name!r} runs, or another --schedule") from None
    peaks = [m / 1e9 for m in r.peak_memory_bytes]
    out = {"iteration_time_s": r.iteration_time_s, "bubble_fraction": r.bubble_fraction, "peak_memory_gb": peaks,
           "schedule": name, "schedule_params": plan.schedule_params}
    print(f"simulated iteration {r.iteration_time_s:.4f} s, bubble {100 * r.bubble_fraction:.1f}%"
          + (f", {name} {plan.schedule_params}" if plan.schedule_params else ""))
    for i, (peak, st) in enumerate(zip(peaks, plan.stages)):
        cap = pb.cluster.chip(st.chip).usable_bytes / 1e9
        print(f"  stage {i}: peak {peak:.2f} GB"
              + (f" EXCEEDS the {cap:.2f} GB usable on {st.chip}" if peak > cap else ""))
    if a.png:
        from .timeline import write_png
        print(write_png(r, a.png) or f"wrote {a.png}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)
    if a.write_plan:
        plan.save(a.write_plan)
        print(f"wrote {a.write_plan}")
    return 0


def _simulate_groups(a: argparse.Namespace, pb: Any, plan: Plan) -> int:
    """cmd_simulate of a plan whose replica groups run different pipelines (replica_sim)."""
    from .replica_sim import simulate_groups
    for flag in ("schedule", "png", "write_plan"):
        if getattr(a, flag):
            raise SpecError(a.plan, "--" + flag.replace("_", "-"), "not available for a plan of replica groups",
                            "the plan's own schedule, no timeline")
    r = simulate_groups(pb.cm, plan)
    print(f"simulated iteration {r.iteration_time_s:.4f} s over {len(plan.replicas)} replica groups")
    for i, (ends, done) in enumerate(zip(r.compute_end_s, r.stage_end_s)):
        print(f"  group {i}: compute ends {max(ends):.4f} s, after the all-reduces {max(done):.4f} s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"iteration_time_s": r.iteration_time_s, "schedule": plan.schedule,
                       "peak_memory_gb": [[m / 1e9 for m in g] for g in r.peak_memory_bytes]}, f, indent=2)
    return 0


def cmd_compare(a: argparse.Namespace) -> int:
    from .front_door import Budget
    from .front_door import plan as plan_of
    from .planning import load_problem
    _writable(a.json, "--json")
    pb = load_problem(a.cluster, a.model, a.train, a.profile, a.seq_len)
    rows = {}
    for algo in ("h2", "auto"):
        out = plan_of(pb, Budget(group_size=a.group_size), algo)
        res, dt = out.search, out.search_time_s
        sim = out.plan.iteration_time_s  # the plan's schedule and parameters
        rows[algo] = {"search_time_s": dt, "iteration_time_s": res.best.time_s, "simulated_s": sim, "dp": res.best.dp,
                      "stages": len(res.best.stages)}
        print(f"{algo:>5}: search {dt:.3f} s, estimated {res.best.time_s:.4f} s, simulated {sim:.4f} s, "
              f"dp={res.best.dp}, {len(res.best.stages)} stages")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


def cmd_profile(a: argparse.Namespace) -> int:
    from .profiler import profile_model
    _writable(a.out, "--out")
    tps = [int(x) for x in a.tp.split(",")]
    prof = profile_model(a.model, tps, a.device, chip=a.chip, seq_len=a.seq_len, micro_batch_size=a.micro_batch_size,
                         repeats=a.repeats, progress=_progress)
    prof.save(a.out)
    print(f"wrote {a.out}")
    return 0


def _sized(a: argparse.Namespace, pb: Any, budget: Any) -> Any:
    """cmd_plan's plan with the micro-batch size searched (micro_batch.py) over --micro-batch-sizes."""
    from .micro_batch import candidate_sizes, plan_micro_batch
    flag = "--micro-batch-sizes"
    measured = _profiles(a.profile) if a.profile else None
    if a.micro_batch_sizes == "auto":  # with measured profiles: the sizes they hold that divide the global batch
        sizes = candidate_sizes(pb.train) if measured is None else [
            x for x in sorted(measured) if pb.train.global_batch % x == 0]
    else:
        try:
            sizes = [int(x) for x in a.micro_batch_sizes.split(",")]
        except ValueError:
            raise SpecError("<command line>", flag, f"got {a.micro_batch_sizes!r}",
                            "auto, or sizes separated by commas (1,2,4)") from None
        bad = [x for x in sizes if x < 1 or pb.train.global_batch % x]
        if bad:
            raise SpecError("<command line>", flag, f"got {bad[0]}",
                            f"positive divisors of the global batch ({pb.train.global_batch} sequences)")
    if measured is not None:
        missing = [x for x in sizes if x not in measured]
        if missing or not sizes:
            raise SpecError(a.profile[0], flag, f"no profile of micro-batch size {', '.join(map(str, missing))} "
                            f"(the profiles hold {', '.join(map(str, sorted(measured)))}, global batch "
                            f"{pb.train.global_batch})", "one --profile per size searched (heteroauto profile "
                            "--micro-batch-size), or sizes the profiles hold")
    sized = plan_micro_batch(pb.cluster, pb.model, pb.train, sizes, budget, a.algo,
                             _progress if a.progress else None, measured,
                             ", ".join(a.profile) if a.profile else None)
    tried = ", ".join(f"{s}: {t:.4f} s" if t < float("inf") else f"{s}: none faster" for s, t in sized.times.items())
    print(f"micro-batch sizes tried (iteration time): {tried}")
    return sized.result


def _profiles(paths: list[str]) -> dict[int, Any]:
    """The measured profiles by their micro-batch size, the files of one size (each of other chip types)
    merged."""
    from .profiles import Profile, merged
    by_size: dict[int, list[tuple[str, Profile]]] = {}
    for path in paths:
        prof = Profile.load(path)
        by_size.setdefault(prof.micro_batch_size, []).append((path, prof))
    return {size: merged(files) for size, files in by_size.items()}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="heteroauto", description="Plan heterogeneous pipeline-parallel training.")
    ap.add_argument("-v", "--verbose", action="store_true")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("plan", help="search the best plan")
    _add_inputs(p, sizes=True)
    p.add_argument("--algo", choices=("auto", "h2"), default="auto")
    p.add_argument("--json", help="write the plan here")
    p.add_argument("--explain", action="store_true", help="bottleneck, memory headroom, runners-up")
    p.add_argument("--no-progress", dest="progress", action="store_false")
    p.add_argument("--work-budget", type=at_least(1), default=DEFAULT_WORK,
                   help="units of search work (one stage split, or 64 bound cells) before the search returns its "
                   "best plan and a bound; the plan depends on the inputs alone, never on the machine's load")
    p.add_argument("--no-baselines", dest="baselines", action="store_false",
                   help="return the search's plan without checking it against the baselines (h2, chip-type subsets, "
                   "rounded counts, a FLOPs-proportional split), which it may then be slower than")
    p.add_argument("--time-cap", "--time-budget", dest="time_cap", type=positive, default=None,
                   help="optional wall-clock cap in seconds: may stop the search earlier, which then says so "
                   "(the plan may then differ between machines or loads)")
    p.add_argument("--micro-batch-sizes", help="search the micro-batch size: auto (powers of two up to 16 that divide "
                   "the global batch) or sizes separated by commas; the training spec's size is then not used")
    p.add_argument("--per-replica", action="store_true",
                   help="also plan replica groups with different pipelines (every split of the chip types, each "
                   "planned alone with its share of the batch); `heteropp run` trains them")
    p.add_argument(
        "--idle",
        choices=IDLE_MODES,
        default="auto",
        help="plans that leave chips idle: when no plan uses every chip or the search was bounded (auto), never, "
        "or also",
    )
    p.set_defaults(fn=cmd_plan)
    s = sub.add_parser("simulate", help="discrete-event simulation of a plan")
    s.add_argument("plan")
    _add_inputs(s)
    s.add_argument("--schedule", choices=SCHEDULES,
                   help="simulate under this schedule (h1f1b: extra warm-up derived from the plan's costs)")
    s.add_argument("--write-plan", help="write the plan with the simulated schedule and its parameters here")
    s.add_argument("--png", help="write a timeline PNG (needs matplotlib)")
    s.add_argument("--json")
    s.set_defaults(fn=cmd_simulate)
    c = sub.add_parser("compare", help="h2 and auto side by side")
    _add_inputs(c)
    c.add_argument("--json")
    c.set_defaults(fn=cmd_compare)
    f = sub.add_parser("profile", help="time a real layer on this machine")
    f.add_argument("--model", required=True)
    f.add_argument("--tp", default="1", help="comma-separated TP sizes to emulate (one shard per rank)")
    f.add_argument("--device", default="cpu", help="device name; `device` resolves through ditorch")
    f.add_argument("--chip", default="cpu", help="chip name to record in the profile")
    f.add_argument("--seq-len", type=int)
    f.add_argument("--micro-batch-size", type=int, default=1)
    f.add_argument("--repeats", type=int, default=3)
    f.add_argument("--out", required=True)
    f.set_defaults(fn=cmd_profile)
    return ap


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if a.verbose else logging.WARNING, format="%(name)s: %(message)s")
    try:
        code: int = a.fn(a)
        return code
    except (SpecError, InfeasibleError) as e:
        print(f"heteroauto: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
