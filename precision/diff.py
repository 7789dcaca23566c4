"""Align two captures op by op (a device run against a reference run) and find the first op
whose outputs differ beyond tolerance."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .dump import Dump, check_replayable
from .metrics import DEFAULT_RATIO_K, ToleranceTable, TreeVerdict, compare_trees, compare_trees_ratio, op_tolerances
from .records import resolve_op
from .reference import run_reference, skip_reason

_ID_FIELDS = ("index", "op", "overload", "phase", "module", "step", "rank")


@dataclass
class DiffReport:
    dump_a: str
    dump_b: str
    ops: list[dict] = field(default_factory=list)  # one record per op, in call order

    @property
    def failed(self) -> list[dict]:
        return [r for r in self.ops if r["status"] == "fail"]

    @property
    def first_divergence(self) -> dict | None:
        return self.failed[0] if self.failed else None

    @property
    def passed(self) -> bool:
        return not self.failed

    def to_dict(self) -> dict:
        count = lambda s: sum(r["status"] == s for r in self.ops)  # noqa: E731
        return {"dump_a": self.dump_a, "dump_b": self.dump_b, "passed": self.passed, "n_ops": len(self.ops),
                "n_passed": count("pass"), "n_failed": count("fail"), "n_skipped": count("skipped"),
                "first_divergence": self.first_divergence, "ops": self.ops}


def _row(rec: dict, status: str, rule: str, detail: str, verdict: TreeVerdict | None = None) -> dict:
    row = {k: rec.get(k) for k in _ID_FIELDS}
    row.update(status=status, rule=rule, detail=detail)
    if verdict is not None:
        summary = verdict.summary()
        summary.pop("passed"), summary.pop("rule"), summary.pop("detail")
        row.update(summary)
    return row


RULES = ("auto", "allclose", "error_ratio")


@dataclass(frozen=True)
class CompareOptions:
    """How ops are judged. ``rule``: "error_ratio" replays each op in float64 on the CPU from both
    runs' own inputs (so drift inherited from earlier ops is not blamed on later ones); "allclose"
    compares the runs' outputs directly; "auto" (default) uses the error ratio wherever an op can
    be replayed (known op, not random, inputs saved) and allclose elsewhere."""

    rule: str = "auto"
    ratio_k: float = DEFAULT_RATIO_K
    tolerances: ToleranceTable = ToleranceTable()


def _replay_func(ra: dict, da: dict, db: dict):
    """The op to replay in float64, or the reason it cannot be."""
    try:
        func = resolve_op(ra["op"], ra.get("overload") or "default")
    except LookupError:
        return None, f"op {ra['op']} unknown to this torch: no float64 replay"
    reason = skip_reason(func)
    if reason:
        return None, reason
    try:
        check_replayable((da["args"], da["kwargs"], db["args"], db["kwargs"]), f"op {ra['op']} #{ra['index']}")
    except ValueError as exc:
        return None, str(exc)
    return func, None


def compare_records(a: Dump, b: Dump, ra: dict, rb: dict, opts: CompareOptions) -> dict:
    """One op of run A (the device) against the same op of run B (the reference)."""
    da, db = a.load(ra), b.load(rb)
    if da is None or db is None:
        return _row(ra, "skipped", "skipped", "tensors not saved in " + ("A" if da is None else "B"))
    func, why_not = (None, "") if opts.rule == "allclose" else _replay_func(ra, da, db)
    if func is not None and ra["op"] != rb["op"]:
        # equivalent ops (precision.align): neither run's op can stand for the other's in a replay
        func, why_not = None, f"{ra['op']} and {rb['op']} are different ops"
    if func is None and (opts.rule == "error_ratio" or why_not == "uninitialised output"):
        return _row(ra, "skipped", "skipped", why_not)
    if func is not None:
        fa = run_reference(func, da["args"], da["kwargs"])
        fb = run_reference(func, db["args"], db["kwargs"])
        verdict = compare_trees_ratio(da["outputs"], db["outputs"], fa, k=opts.ratio_k, reference_fp64=fb)
    else:
        rtol, atol = op_tolerances(opts.tolerances, ra["op"], da["outputs"], db["outputs"])
        verdict = compare_trees(da["outputs"], db["outputs"], rtol=rtol, atol=atol)
    if not verdict.verdicts:
        return _row(ra, "skipped", "skipped", verdict.detail or "no tensor outputs")
    deciding = verdict.deciding
    return _row(ra, "pass" if verdict.passed else "fail", verdict.rule, deciding.detail if deciding else "", verdict)


def compare_dumps(dump_a: str, dump_b: str, *, rtol: float | None = None, atol: float | None = None,
                  ratio_k: float | None = None, options: CompareOptions | None = None) -> DiffReport:
    """Compare capture A (device) against capture B (reference), aligned by call index.

    ``options`` (default: the auto rule); the older keywords still work: ``ratio_k`` asks for the
    error-ratio rule with that k, ``rtol``/``atol`` for allclose with those tolerances."""
    if options is None:
        if ratio_k is not None:
            options = CompareOptions("error_ratio", ratio_k, ToleranceTable(rtol=rtol, atol=atol))
        elif rtol is not None or atol is not None:
            options = CompareOptions("allclose", tolerances=ToleranceTable(rtol=rtol, atol=atol))
        else:
            options = CompareOptions()
    a, b = Dump.open(dump_a), Dump.open(dump_b)
    ia, ib = a.by_index(), b.by_index()
    report = DiffReport(dump_a, dump_b)
    with torch.no_grad():
        for index in sorted(set(ia) | set(ib)):
            ra, rb = ia.get(index), ib.get(index)
            if ra is None or rb is None:
                present = ra or rb
                where = "A" if ra is None else "B"
                report.ops.append(_row(present, "fail", "alignment", f"op #{index} {present['op']} missing in {where}"))
                continue
            if ra["op"] != rb["op"] or ra.get("overload") != rb.get("overload"):
                report.ops.append(_row(ra, "fail", "alignment", f"op {ra['op']} in A but {rb['op']} in B at index "
                                       f"{ra['index']}: the runs took different paths"))
                continue
            report.ops.append(compare_records(a, b, ra, rb, options))
    return report
