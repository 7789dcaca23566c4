"""Align two captures op by op (a device run against a reference run) and find the first op
whose outputs differ beyond tolerance."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .dump import Dump, check_replayable
from .metrics import TreeVerdict, compare_trees, compare_trees_ratio
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


def _compare_one(a: Dump, b: Dump, ra: dict, rb: dict, rtol, atol, ratio_k) -> dict:
    if ra["op"] != rb["op"] or ra.get("overload") != rb.get("overload"):
        return _row(ra, "fail", "alignment", f"op {ra['op']} in A but {rb['op']} in B at index {ra['index']}: "
                    "the runs took different paths")
    try:
        func = resolve_op(ra["op"], ra.get("overload", "default"))
        reason = skip_reason(func)
    except LookupError:
        func, reason = None, None
    if reason:
        return _row(ra, "skipped", "skipped", reason)
    da, db = a.load(ra), b.load(rb)
    if da is None or db is None:
        return _row(ra, "skipped", "skipped", "tensors not saved in " + ("A" if da is None else "B"))
    if ratio_k is None:
        verdict = compare_trees(da["outputs"], db["outputs"], rtol=rtol, atol=atol)
    else:
        if func is None:
            return _row(ra, "skipped", "skipped", f"op {ra['op']} unknown to this torch: no float64 replay")
        try:
            check_replayable((da["args"], da["kwargs"], db["args"], db["kwargs"]), f"op {ra['op']} #{ra['index']}")
        except ValueError as exc:
            return _row(ra, "skipped", "skipped", str(exc))
        fa = run_reference(func, da["args"], da["kwargs"])
        fb = run_reference(func, db["args"], db["kwargs"])
        verdict = compare_trees_ratio(da["outputs"], db["outputs"], fa, k=ratio_k, reference_fp64=fb)
    if not verdict.verdicts:
        return _row(ra, "skipped", "skipped", verdict.detail or "no tensor outputs")
    deciding = verdict.deciding
    return _row(ra, "pass" if verdict.passed else "fail", verdict.rule, deciding.detail if deciding else "", verdict)


def compare_dumps(dump_a: str, dump_b: str, *, rtol: float | None = None, atol: float | None = None,
                  ratio_k: float | None = None) -> DiffReport:
    """Compare capture A (device) against capture B (reference), aligned by call index.

    Default rule: A's outputs against B's with A's dtype tolerances. With ``ratio_k``: each op is
    replayed in float64 on the CPU from both runs' inputs and the error-ratio rule decides."""
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
            report.ops.append(_compare_one(a, b, ra, rb, rtol, atol, ratio_k))
    return report
