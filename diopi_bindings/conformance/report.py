"""Conformance results as a text table (one row per operator), JSON and a standalone HTML page."""
from __future__ import annotations

import html
import json
from collections import Counter
from pathlib import Path
from typing import Any

from diopi_bindings.conformance.diopi_named import DiopiNamedInfo
from diopi_bindings.conformance.runner import (
    CRASH,
    DECLINED,
    ERROR,
    FAIL,
    FAILING,
    NOT_IMPLEMENTED,
    PASS,
    SKIPPED,
    TIMEOUT,
    CaseResult,
)
from diopi_bindings.library import LibraryInfo

_COLUMNS = (PASS, FAIL, ERROR, CRASH, SKIPPED, DECLINED)
Info = LibraryInfo | DiopiNamedInfo


def title(info: Info) -> str:
    if isinstance(info, DiopiNamedInfo):
        return info.title
    return f"{info.vendor} {info.version} (DIOPI ABI {info.abi_version}): {info.path}"


def per_op(results: list[CaseResult]) -> dict[str, dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    for r in results:
        row = rows.setdefault(r.op, {"counts": Counter(), "first_problem": "", "function": r.function})
        row["counts"][r.status] += 1
        if r.status in FAILING and not row["first_problem"]:
            row["first_problem"] = f"{r.case} [{r.dtype}]: {r.detail}"
    return rows


def verdict_of(counts: Counter) -> str:
    if counts[NOT_IMPLEMENTED]:
        return NOT_IMPLEMENTED
    if any(counts[s] for s in FAILING):
        return FAIL
    return PASS if counts[PASS] else DECLINED if counts[DECLINED] else SKIPPED


def _label(op: str, row: dict[str, Any]) -> str:
    """The operator, and the DIOPI function its cases called when that is not the project's ABI symbol."""
    function = row.get("function") or ""
    return f"{op} ({function})" if function.startswith("diopi") and not function.startswith("diopi_") else op


def table(results: list[CaseResult], info: Info, tolerances: dict[str, dict[str, float]] | None = None) -> str:
    rows = per_op(results)
    width = max((len(_label(op, row)) for op, row in rows.items()), default=10)
    lines = [title(info),
             f"{'operator':<{width}}  {'verdict':<15} " + " ".join(f"{c:>8}" for c in _COLUMNS) + "  first problem"]
    for op, row in rows.items():
        counts = row["counts"]
        lines.append(f"{_label(op, row):<{width}}  {verdict_of(counts):<15} "
                     + " ".join(f"{counts[c]:>8}" for c in _COLUMNS)
                     + (f"  {row['first_problem'][:160]}" if row["first_problem"] else ""))
    lines.append(summary(results))
    lines += untested_lines(results, tolerances)
    return "\n".join(lines)


def summary(results: list[CaseResult]) -> str:
    verdicts = Counter(verdict_of(row["counts"]) for row in per_op(results).values())
    cases = Counter(r.status for r in results)
    return (f"operators: {verdicts[PASS]} pass, {verdicts[FAIL]} fail, {verdicts[NOT_IMPLEMENTED]} not implemented, "
            f"{verdicts[SKIPPED]} skipped, {verdicts[DECLINED]} declined; "
            f"cases: {cases[PASS]} pass, {cases[FAIL]} fail, {cases[ERROR]} error, {cases[CRASH]} crash, "
            f"{cases[TIMEOUT]} timeout, {cases[SKIPPED]} skipped, "
            f"{cases[DECLINED]} declined")


def skipped(results: list[CaseResult], status: str = SKIPPED) -> list[dict[str, Any]]:
    """Skipped (or declined) cases grouped by operator and reason: which dtypes, how many cases."""
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for r in results:
        if r.status == status:
            g = groups.setdefault((r.op, r.detail), {"op": r.op, "dtypes": [], "reason": r.detail, "cases": 0})
            if r.dtype not in g["dtypes"]:
                g["dtypes"].append(r.dtype)
            g["cases"] += 1
    return list(groups.values())


def untested_lines(results: list[CaseResult], tolerances: dict[str, dict[str, float]] | None = None) -> list[str]:
    """What the verdict does not cover, in words: skips with their reasons, operators not implemented,
    cases that crashed or timed out (the operator's later cases ran), tolerances the vendor loosened."""
    lines = [f"skipped: {g['op']} [{', '.join(g['dtypes'])}] ({g['cases']} cases): {g['reason']}"
             for g in skipped(results)]
    lines += [f"declined: {g['op']} [{', '.join(g['dtypes'])}] ({g['cases']} cases): {g['reason']}"
              for g in skipped(results, DECLINED)]
    lines += [f"not implemented: {r.op} ({r.detail})" for r in results if r.status == NOT_IMPLEMENTED]
    lines += [f"{r.status}: {r.op} {r.case} [{r.dtype}]: {r.detail}" for r in results if r.status in (CRASH, TIMEOUT)]
    lines += [f"tolerance loosened by the vendor file: {key} {value}" for key, value in (tolerances or {}).items()]
    return lines


def to_json(results: list[CaseResult], info: Info,
            tolerances: dict[str, dict[str, float]] | None = None) -> dict[str, Any]:
    library = info.to_dict() if isinstance(info, DiopiNamedInfo) else {
        "path": info.path, "vendor": info.vendor, "version": info.version, "abi_version": info.abi_version,
        "interface": "project ABI", "implemented": list(info.implemented), "missing": list(info.missing)}
    return {
        "library": library,
        "operators": {op: {"verdict": verdict_of(row["counts"]), "counts": dict(row["counts"]),
                           "function": row["function"], "first_problem": row["first_problem"]}
                      for op, row in per_op(results).items()},
        "cases": [r.to_dict() for r in results],
        "summary": summary(results),
        "skipped": skipped(results),
        "declined": skipped(results, DECLINED),
        "not_implemented": [r.op for r in results if r.status == NOT_IMPLEMENTED],
        "crashed": [r.to_dict() for r in results if r.status in (CRASH, TIMEOUT)],
        "vendor_tolerances": tolerances or {},
    }


def write_json(path: str, results: list[CaseResult], info: Info,
               tolerances: dict[str, dict[str, float]] | None = None) -> None:
    Path(path).write_text(json.dumps(to_json(results, info, tolerances), indent=1))


def write_html(path: str, results: list[CaseResult], info: Info,
               tolerances: dict[str, dict[str, float]] | None = None) -> None:
    colour = {PASS: "#d4f4d4", FAIL: "#f8d0d0", NOT_IMPLEMENTED: "#eeeeee", SKIPPED: "#fff3c4", DECLINED: "#eeeeee"}
    rows = []
    for op, row in per_op(results).items():
        verdict = verdict_of(row["counts"])
        cells = "".join(f"<td>{row['counts'][c]}</td>" for c in _COLUMNS)
        rows.append(f'<tr style="background:{colour[verdict]}"><td><code>{html.escape(_label(op, row))}</code></td>'
                    f"<td>{verdict}</td>{cells}<td>{html.escape(row['first_problem'])}</td></tr>")
    head = "".join(f"<th>{c}</th>" for c in ("operator", "verdict", *_COLUMNS, "first problem"))
    heading = html.escape(f"DIOPI conformance: {info.vendor} {info.version}")
    Path(path).write_text(
        f"<!doctype html><html><head><meta charset='utf-8'><title>{heading}</title></head><body>"
        f"<h1>{heading}</h1><p>{html.escape(title(info))}</p>"
        f"<p>{html.escape(summary(results))}</p>"
        + "".join(f"<p>{html.escape(line)}</p>" for line in untested_lines(results, tolerances))
        + "<table border='1' cellspacing='0' cellpadding='3'>"
        f"<tr>{head}</tr>{''.join(rows)}</table></body></html>\n")
