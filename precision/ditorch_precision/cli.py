"""precision-diff: compare two captures, replay a captured op, check a loss curve.

Exit status: 0 pass, 1 fail, 2 unreadable or mismatched inputs (the message says which)."""
from __future__ import annotations

import argparse
import json
import logging
import sys

from .arguments import cli_type, device, floating_dtype, non_negative_float, non_negative_int, output_file
from .loss import DEFAULT_THRESHOLD, LossInputError, LossReport, loss_check

# torch is imported by the compare/replay commands only: the loss check stays light.
DEFAULT_RATIO_K = 4.0  # ditorch_precision.metrics.DEFAULT_RATIO_K, checked in cmd_compare

EXIT_PASS, EXIT_FAIL, EXIT_INPUT = 0, 1, 2


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.3g}"
    return "-" if v is None else str(v)


class _Unmatched:
    """What the summary prints of the unmatched rows, gathered as a streamed compare hands them
    over (its report keeps none): op names per region, the first module records without a partner."""

    def __init__(self, rows=()) -> None:
        self.names: dict[tuple, set[str]] = {}  # (run, module, phase) -> op names
        self.modules: list[dict] = []
        self.n_modules = 0
        for r in rows:
            self.add(r)

    def add(self, row: dict) -> None:
        if row["op"].startswith(("module::", "optimizer::")):
            self.n_modules += 1
            if len(self.modules) < 5:
                self.modules.append(row)
        else:
            self.names.setdefault((row["run"], row["module"], row["phase"]), set()).add(row["op"])


def _print_diff(report, rows: int, show_all: bool, unmatched: _Unmatched | None = None) -> None:
    d = report.to_dict()
    unmatched = unmatched or _Unmatched(report.unmatched)
    cols = ("index", "op", "phase", "module", "status", "rule", "max_abs", "max_rel", "cosine", "max_ulp")
    shown = report.ops if show_all else report.failed[:rows]
    for note in report.notes:
        print(f"note: {note}")
    if shown:
        print(" ".join(f"{c:<10}" if c not in ("op", "module") else f"{c:<28}" for c in cols))
        for r in shown:
            print(" ".join(f"{_fmt(r.get(c)):<10}" if c not in ("op", "module") else f"{_fmt(r.get(c))[-28:]:<28}"
                           for c in cols))
    print(f"{d['n_ops']} ops: {d['n_passed']} pass, {d['n_failed']} fail, {d['n_skipped']} skipped, "
          f"{d['n_unmatched']} unmatched")
    if d["streamed"]:
        verdicts = {k.removeprefix("region:"): n for k, n in report.counts.items() if k.startswith("region:")}
        if verdicts:
            print("regions whose op sequences differ: " + ", ".join(f"{n} {v}" for v, n in sorted(verdicts.items()))
                  + ("; those that fail or cannot be judged:" if d["regions"] else ""))
    for region in d["regions"]:
        ops_a = sorted(unmatched.names.get(("A", region["module"], region["phase"]), ()))
        ops_b = sorted(unmatched.names.get(("B", region["module"], region["phase"]), ()))
        print(f"region {region['module'] or '(no module)'} ({region['phase']}, step {region['step']}): op sequences "
              f"differ (only in A: {', '.join(ops_a) or '-'}; only in B: {', '.join(ops_b) or '-'}); "
              f"{region['verdict']}: {region['n_ops_checked']} of A's ops against their float64 replay, "
              f"{region['n_module_records']} module records; {region['detail']}")
    if unmatched.n_modules:
        print(f"{unmatched.n_modules} module records without a partner: "
              + ", ".join(f"{r['op']} {r['module']} ({r['phase']}, step {r['step']}, only in {r['run']})"
                          for r in unmatched.modules) + (" ..." if unmatched.n_modules > 5 else ""))
    fd = d["first_divergence"]
    if fd:
        print(f"first divergence: {fd['op']} #{fd['index']} ({fd['phase']}, module {fd['module']}, step "
              f"{fd['step']}): {fd['rule']}: {fd['detail']}")
    elif d["n_unjudged_regions"]:
        print(f"no divergence found, but {d['n_unjudged_regions']} regions could not be judged: not a pass")
    elif drift := report.counts["region:drift"]:  # counted also where a streamed compare kept no passing region
        print(f"no divergence located; {drift} regions drift (their module records differ after a divergence "
              f"or a random draw, which no op explains: a fault there is not located)")
    else:
        print("no divergence")


def _tolerances(args):
    """--tol, or PRECISION_TOL when --tol is not given (both given and different: an error)."""
    import os

    from .metrics import ToleranceTable

    env_tol = os.environ.get("PRECISION_TOL")
    if args.tol and env_tol and ",".join(args.tol) != env_tol:
        raise ValueError(f"--tol {','.join(args.tol)!r} and PRECISION_TOL={env_tol!r} disagree; give one of them")
    return ToleranceTable.parse(",".join(args.tol) if args.tol else env_tol, rtol=args.rtol, atol=args.atol)


def cmd_compare(args) -> int:
    from .align import Equivalences
    from .diff import CompareOptions, compare_dumps, rank_dirs
    from .dump import DumpError
    from .metrics import DEFAULT_RATIO_K as k_default

    assert k_default == DEFAULT_RATIO_K, "keep cli.DEFAULT_RATIO_K in step with ditorch_precision.metrics"
    if args.error_ratio is not None and args.rule not in (None, "error_ratio"):
        return _input_error(args, f"--error-ratio asks for the error_ratio rule, but --rule is {args.rule}")
    rule = args.rule or ("error_ratio" if args.error_ratio is not None else "auto")
    try:
        options = CompareOptions(rule, args.error_ratio if args.error_ratio is not None else DEFAULT_RATIO_K,
                                 _tolerances(args), args.align, Equivalences.load(args.map))
        if args.tp_shards or rank_dirs(args.dump_a) is not None or rank_dirs(args.dump_b) is not None:
            return _compare_ranks(args, options)
        # Streamed (memory bounded whatever the captures' length) unless every row is asked for.
        stream = not (args.json or args.html or args.all)
        unmatched = _Unmatched()
        table = None
        if stream and args.csv:
            from .report import DiffCsv

            table = DiffCsv(args.csv)

        def on_row(kind: str, row: dict) -> None:
            if kind == "op" and table is not None:
                table.write(row)
            elif kind == "unmatched":
                unmatched.add(row)

        try:
            report = compare_dumps(args.dump_a, args.dump_b, options=options, on_row=on_row if stream else None)
        finally:
            if table is not None:
                table.close()
    except (DumpError, ValueError) as exc:
        return _input_error(args, str(exc))
    d = report.to_dict()
    if d["n_passed"] + d["n_failed"] == 0:
        what = "no ops" if not d["n_ops"] else f"all {d['n_ops']} ops were skipped"
        return _input_error(args, f"nothing was compared ({what}): check that the captures selected the same ops "
                                  "and saved their tensors (size cap, save_tensors)")
    if args.csv and not stream:
        from .report import write_diff_csv

        write_diff_csv(report, args.csv)
    if args.html:
        from .report import diff_html

        with open(args.html, "w") as f:
            f.write(diff_html(report))
    if args.json:
        print(json.dumps(d, indent=1))
    else:
        _print_diff(report, args.rows, args.all, unmatched if stream else None)
    return EXIT_PASS if report.passed else EXIT_FAIL


def _compare_ranks(args, options) -> int:
    """Both arguments hold rank{r} captures: one compare per rank, the collectives checked across
    ranks, one summary."""
    from .diff import compare_ranks

    result = compare_ranks(args.dump_a, args.dump_b, options, tp_shards=args.tp_shards)
    d = result.to_dict()
    if d["n_passed"] + d["n_failed"] == 0 and not d["collectives"]:
        return _input_error(args, "nothing was compared: every op of every rank was skipped")
    if args.csv:  # per rank next to it (F.rank{r}.csv), the cross-rank summary at F
        from .report import write_ranks_csv

        write_ranks_csv(result, args.csv)
    if args.html:
        from .report import ranks_html

        ranks_html(result, args.html)
    if args.json:
        print(json.dumps(d, indent=1))
    else:
        for note in d["notes"]:
            print(f"note: {note}")
        for rank in d["ranks"]:
            r = d["per_rank"][rank]
            print(f"rank {rank}: {r['n_ops']} ops: {r['n_passed']} pass, {r['n_failed']} fail, "
                  f"{r['n_skipped']} skipped, {r['n_unmatched']} unmatched")
        bad = [c for c in d["collectives"] if c["status"] == "fail"]
        print(f"collectives of A across ranks: {len(d['collectives'])} checked, {len(bad)} fail"
              + (f" (first: {bad[0]['op']} #{bad[0].get('index')}: {bad[0]['detail']})" if bad else ""))
        fd = d["first_divergence"]
        print(f"{len(d['ranks'])} ranks: {'no divergence' if fd is None else 'first divergence: '}"
              + ("" if fd is None else f"rank {fd.get('rank')} {fd['op']} #{fd.get('index')} ({fd.get('phase')}, "
                                        f"module {fd.get('module')}, step {fd.get('step')}): {fd['detail']}"))
    return EXIT_PASS if result.passed else EXIT_FAIL


def cmd_replay(args) -> int:
    from .dump import DumpError
    from .replay import replay

    try:
        result = replay(args.dump, args.op_index, device=args.device, dtype=args.dtype, rtol=args.rtol, atol=args.atol,
                        backward=args.backward, repeat=args.repeat)
    except (DumpError, LookupError, ValueError) as exc:
        return _input_error(args, str(exc))
    d = result.to_dict()
    if args.json:
        print(json.dumps(d, indent=1))
    else:
        print(f"{d['op']} #{d['index']} (module {d['module']}) on {d['device']}"
              f"{' in ' + d['dtype'] if d['dtype'] else ''}: {'pass' if d['passed'] else 'FAIL'} by {d['rule']}: "
              f"{d['detail']}; max_abs {_fmt(d.get('max_abs'))}, max_rel {_fmt(d.get('max_rel'))}"
              f"{'; ' + d['note'] if d['note'] else ''}")
        if "backward" in d:
            b = d["backward"]
            print(f"backward: {'pass' if b['passed'] else 'FAIL'} by {b['rule']}: {b['detail']}")
        if "timing" in d:
            print("timing (median of {repeat}): ".format(**d["timing"]) + ", ".join(
                f"{k} {v:.3f}" for k, v in d["timing"].items() if k != "repeat"))
    passed = result.verdict.passed and (result.backward is None or result.backward.passed)
    return EXIT_PASS if passed else EXIT_FAIL


def _print_loss(r: LossReport) -> None:
    print(f"{'PASS' if r.passed else 'FAIL'}: MRE {r.mre:.4%} over {r.n} steps (threshold {r.threshold:.2%}); "
          f"max relative error {r.max_rel:.4%}; first divergence step {r.first_divergence_step}")


def cmd_loss(args) -> int:
    try:
        report = loss_check(args.run, args.ref, threshold=args.threshold, warmup=args.warmup,
                            common_steps=args.common_steps)
    except LossInputError as exc:
        return _input_error(args, str(exc), nan_steps=exc.nan_steps)
    if args.csv:
        from .report import write_loss_csv

        write_loss_csv(report, args.csv)
    if args.html:
        from .report import loss_html

        with open(args.html, "w") as f:
            f.write(loss_html(report))
    if args.json:
        print(json.dumps(report.to_dict(curves=args.curves), indent=1))
    else:
        _print_loss(report)
    if args.plot:
        from .plot import PlotUnavailable, plot_loss

        try:
            plot_loss(report, args.plot)
        except PlotUnavailable as exc:
            print(f"precision-diff loss: {exc}", file=sys.stderr)
            return EXIT_INPUT
    return EXIT_PASS if report.passed else EXIT_FAIL


def _input_error(args, message: str, **extra) -> int:
    print(f"precision-diff {args.command}: {message}", file=sys.stderr)
    if getattr(args, "json", False):
        print(json.dumps({"error": message, **extra}))
    return EXIT_INPUT


_nonneg, _count, _out = cli_type(non_negative_float), cli_type(non_negative_int), cli_type(output_file)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="precision-diff", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-v", "--verbose", action="store_true")
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser("compare", help="align two captures op by op and report the first divergent op")
    c.add_argument("dump_a", help="capture of the run under test (the device)")
    c.add_argument("dump_b", help="capture of the reference run")
    c.add_argument("--rtol", type=_nonneg, help="relative tolerance of the allclose rule (default: per dtype)")
    c.add_argument("--atol", type=_nonneg, help="absolute tolerance (default: per dtype)")
    c.add_argument("--error-ratio", type=_nonneg, metavar="K", nargs="?", const=DEFAULT_RATIO_K,
                   help=f"judge every op by the error-ratio rule (replay it in float64 on the CPU from both runs' "
                        f"inputs; the device's error may be at most K x the reference's, K={DEFAULT_RATIO_K:g}); "
                        "ops that cannot be replayed are skipped")
    c.add_argument("--rule", choices=("auto", "allclose", "error_ratio"),
                   help="auto (default): error_ratio wherever an op can be replayed in float64, else allclose")
    c.add_argument("--tol", action="append", metavar="KEY=RTOL[:ATOL]",
                   help="tolerance per dtype or op pattern, e.g. float32=1e-5:1e-6 or aten::rsqrt=1e-4 "
                        "(repeatable or comma-separated; default: $PRECISION_TOL)")
    c.add_argument("--align", choices=("structure", "index"), default="structure",
                   help="structure (default): by step, phase, module path and place among the module's ops; "
                        "index: by global call index (both runs must run the same ops)")
    c.add_argument("--map", metavar="FILE.json",
                   help='more equivalent ops, {"equivalent": [["aten::a", "aten::b"], ...]}, over the built-in '
                        "table (the attention kernels of each device, fused Adam/AdamW)")
    c.add_argument("--tp-shards", action="store_true",
                   help="DUMP_A's ranks are one tensor-parallel group and DUMP_B one rank of the same model: each "
                        "rank of A against B, module records and parameters that A holds in slices gathered across "
                        "A's ranks")
    c.add_argument("--rows", type=_count, default=20, help="failing rows to print (default 20)")
    c.add_argument("--all", action="store_true", help="print every op, not only failures")
    c.add_argument("--json", action="store_true", help="JSON: first_divergence and one record per op")
    c.add_argument("--csv", metavar="FILE", type=_out,
                   help="also write the per-op table as CSV (rank{r} captures: FILE.rank{r}.csv per rank, FILE the "
                        "cross-rank summary)")
    c.add_argument("--html", metavar="FILE", type=_out,
                   help="also write an HTML page with a plot (rank{r} captures: FILE.rank{r}.html per rank, FILE "
                        "the cross-rank summary page linking them)")
    c.set_defaults(func=cmd_compare)

    r = sub.add_parser("replay", help="re-run one captured op on another device/dtype and compare")
    r.add_argument("dump")
    r.add_argument("op_index", type=_count, help="the op's call index (the 'index' in the capture)")
    r.add_argument("--device", default="cpu", type=cli_type(device), help="device to replay on (default cpu)")
    r.add_argument("--dtype", type=cli_type(floating_dtype),
                   help="cast floating inputs to this dtype first, e.g. float64")
    r.add_argument("--rtol", type=_nonneg)
    r.add_argument("--atol", type=_nonneg)
    r.add_argument("--backward", action="store_true",
                   help="also run backward (seeded random output gradients) and compare input gradients with "
                        "float64 CPU ones")
    r.add_argument("--repeat", type=_count, default=0, metavar="N", help="time forward (and backward) N times")
    r.add_argument("--json", action="store_true")
    r.set_defaults(func=cmd_replay)

    lo = sub.add_parser("loss", help="the loss-curve check: MRE of RUN against REF below the threshold")
    lo.add_argument("run", help="loss file of the run under test (JSON lines {step, loss} or CSV step,loss)")
    lo.add_argument("ref", help="loss file of the reference run")
    lo.add_argument("--threshold", type=_nonneg, default=DEFAULT_THRESHOLD, help="MRE threshold (default 0.015)")
    lo.add_argument("--warmup", type=_count, default=0, metavar="K", help="leave out the first K common steps")
    lo.add_argument("--common-steps", action="store_true",
                    help="compare over the steps both files have (default: the step sets must match)")
    lo.add_argument("--json", action="store_true", help="JSON: mre, max_rel, n, passed, first_divergence_step, ...")
    lo.add_argument("--curves", action="store_true", help="with --json: include the per-step values")
    lo.add_argument("--plot", metavar="FILE.png", type=_out, help="write a PNG plot (needs matplotlib)")
    lo.add_argument("--csv", metavar="FILE", type=_out, help="also write the per-step table as CSV")
    lo.add_argument("--html", metavar="FILE", type=_out, help="also write an HTML page with the plots")
    lo.set_defaults(func=cmd_loss)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
