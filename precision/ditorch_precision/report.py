"""Reports for people: CSV tables and a self-contained HTML page with inline SVG plots."""
from __future__ import annotations

import csv
import html
import math
from typing import Sequence

import os

from .diff import DiffReport, RankReport
from .loss import LossReport

DIFF_COLUMNS = ("index", "op", "overload", "phase", "module", "step", "rank", "status", "rule", "max_abs",
                "max_rel", "mean_rel", "cosine", "max_ulp", "within_0_1pct", "within_0_5pct", "ratio", "detail")


def write_diff_csv(report: DiffReport, path: str) -> None:
    with DiffCsv(path) as out:
        for row in report.ops:
            out.write(row)


class DiffCsv:
    """The per-op table written row by row (a streamed compare's ``on_row``)."""

    def __init__(self, path: str) -> None:
        self._file = open(path, "w", newline="")
        self._writer = csv.DictWriter(self._file, fieldnames=DIFF_COLUMNS, extrasaction="ignore")
        self._writer.writeheader()

    def write(self, row: dict) -> None:
        self._writer.writerow(row)

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> "DiffCsv":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


RANK_COLUMNS = ("rank", "n_ops", "n_passed", "n_failed", "n_skipped", "n_drift", "n_unmatched",
                "n_unjudged_regions", "passed", "first_op", "first_index", "first_phase", "first_module", "first_step",
                "first_rule", "first_detail", "file")


def rank_file(path: str, rank: int) -> str:
    """The per-rank file next to a cross-rank summary: out.html -> out.rank1.html."""
    stem, ext = os.path.splitext(path)
    return f"{stem}.rank{rank}{ext}"


def _rank_rows(result: RankReport, path: str) -> list[dict]:
    rows = []
    for rank, report in sorted(result.reports.items()):
        d, fd = report.to_dict(), report.first_divergence or {}
        rows.append({**{k: d.get(k) for k in RANK_COLUMNS}, "rank": rank,
                     **{f"first_{k}": fd.get(k) for k in ("op", "index", "phase", "module", "step", "rule", "detail")},
                     "file": os.path.basename(rank_file(path, rank))})
    return rows


def write_ranks_csv(result: RankReport, path: str) -> list[str]:
    """A multi-rank compare as CSV: one table per rank (``rank_file``) and, at ``path``, one row per
    rank (its counts and first divergence) then the collectives checked across ranks (rank "all").
    Returns the files written."""
    files = []
    for rank, report in sorted(result.reports.items()):
        write_diff_csv(report, rank_file(path, rank))
        files.append(rank_file(path, rank))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=RANK_COLUMNS, extrasaction="ignore")
        w.writeheader()
        w.writerows(_rank_rows(result, path))
        for c in result.collectives:
            w.writerow({"rank": "all", "first_op": c.get("op"), "first_index": c.get("index"),
                        "first_step": c.get("step"), "first_rule": c.get("rule"), "first_detail": c.get("detail"),
                        "passed": c.get("status") != "fail",
                        "n_failed": int(c.get("status") == "fail"), "n_passed": int(c.get("status") == "pass")})
    return [path, *files]


def ranks_html(result: RankReport, path: str) -> list[str]:
    """A multi-rank compare as HTML: one page per rank (``rank_file``, as ``diff_html`` writes for
    one capture) and, at ``path``, a cross-rank summary page linking them: the first divergence over
    all ranks, a row per rank, the collectives checked across ranks. Returns the files written."""
    files = []
    for rank, report in sorted(result.reports.items()):
        with open(rank_file(path, rank), "w") as f:
            f.write(diff_html(report, title=f"rank {rank}: {report.dump_a} vs {report.dump_b}"))
        files.append(rank_file(path, rank))
    d = result.to_dict()
    fd = d["first_divergence"]
    body = (f"<p><b>{'PASS' if d['passed'] else 'FAIL'}</b>: {len(d['ranks'])} ranks, {d['n_ops']} ops: "
            f"{d['n_passed']} pass, {d['n_failed']} fail, {d['n_skipped']} skipped.</p>")
    if fd:
        body += (f"<p><b>First divergence</b> (over all ranks): rank {fd.get('rank')} {html.escape(str(fd['op']))} "
                 f"#{fd.get('index')} ({fd.get('phase')}, module {html.escape(str(fd.get('module')))}, step "
                 f"{fd.get('step')}): {html.escape(str(fd.get('rule')))}: {html.escape(str(fd.get('detail')))}</p>")
    else:
        body += "<p>No divergence on any rank.</p>"
    cols = ("rank", "n_ops", "n_passed", "n_failed", "n_skipped", "first_op", "first_index", "first_module",
            "first_rule", "first_detail")
    rows = "".join(
        f"<tr class='{'pass' if r['passed'] else 'fail'}'>"
        + "".join(f"<td><a href='{html.escape(r['file'])}'>rank {r['rank']}</a></td>" if c == "rank"
                  else f"<td>{html.escape(_fmt(r.get(c)))}</td>" for c in cols) + "</tr>"
        for r in _rank_rows(result, path))
    body += "<h2>Ranks</h2><table><tr>" + "".join(f"<th>{c}</th>" for c in cols) + f"</tr>{rows}</table>"
    ccols = ("op", "index", "group", "status", "detail")
    crow = "".join(f"<tr class='{html.escape(str(c.get('status')))}'>"
                   + "".join(f"<td>{html.escape(_fmt(c.get(k)))}</td>" for k in ccols) + "</tr>"
                   for c in result.collectives)
    body += (f"<h2>Collectives across ranks ({len(result.collectives)})</h2><table><tr>"
             + "".join(f"<th>{c}</th>" for c in ccols) + f"</tr>{crow}</table>")
    with open(path, "w") as f:
        f.write(_page("cross-rank capture comparison", body))
    return [path, *files]


def write_loss_csv(report: LossReport, path: str) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "loss", "ref_loss", "rel_error"])
        for row in zip(report.steps, report.run, report.ref, report.rel):
            w.writerow(row)


def svg_lines(series: dict[str, tuple[Sequence[float], Sequence[float]]], *, log_y: bool = False,
              width: int = 720, height: int = 300, title: str = "", hline: float | None = None) -> str:
    """A minimal line plot as SVG (no plotting package needed)."""
    colours = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd")
    f = (lambda v: math.log10(v) if v > 0 else None) if log_y else (lambda v: v)
    pts = {k: [(x, f(y)) for x, y in zip(xs, ys) if y is not None and math.isfinite(y) and f(y) is not None]
           for k, (xs, ys) in series.items()}
    allx = [x for p in pts.values() for x, _ in p] or [0, 1]
    ally = [y for p in pts.values() for _, y in p] + ([f(hline)] if hline and f(hline) is not None else []) or [0, 1]
    x0, x1, y0, y1 = min(allx), max(allx), min(ally), max(ally)
    x1, y1 = (x1 if x1 > x0 else x0 + 1), (y1 if y1 > y0 else y0 + 1)
    m = 40
    sx = lambda x: m + (x - x0) / (x1 - x0) * (width - 2 * m)  # noqa: E731
    sy = lambda y: height - m - (y - y0) / (y1 - y0) * (height - 2 * m)  # noqa: E731
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white" stroke="#ccc"/>',
           f'<text x="{m}" y="16">{html.escape(title)}</text>',
           f'<text x="4" y="{m}">{(10 ** y1 if log_y else y1):.3g}</text>',
           f'<text x="4" y="{height - m}">{(10 ** y0 if log_y else y0):.3g}</text>',
           f'<text x="{m}" y="{height - 8}">{x0:g}</text><text x="{width - m}" y="{height - 8}">{x1:g}</text>']
    if hline is not None and f(hline) is not None:
        out.append(f'<line x1="{m}" x2="{width - m}" y1="{sy(f(hline)):.1f}" y2="{sy(f(hline)):.1f}" '
                   'stroke="#999" stroke-dasharray="4"/>')
    for i, (name, p) in enumerate(pts.items()):
        c = colours[i % len(colours)]
        coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in p)
        out.append(f'<polyline fill="none" stroke="{c}" stroke-width="1.5" points="{coords}"/>')
        out.append(f'<text x="{width - m - 120}" y="{20 + 14 * i}" fill="{c}">{html.escape(name)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def _page(title: str, body: str) -> str:
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;font-size:12px}"
            "td,th{border:1px solid #ccc;padding:2px 6px}.fail{background:#fdd}.pass{background:#efe}</style>"
            f"</head><body><h1>{html.escape(title)}</h1>{body}</body></html>")


def loss_html(report: LossReport) -> str:
    verdict = "PASS" if report.passed else "FAIL"
    body = (f"<p><b>{verdict}</b>: MRE {report.mre:.4%} (threshold {report.threshold:.2%}), max relative error "
            f"{report.max_rel:.4%}, n={report.n}, first divergence step {report.first_divergence_step}</p>")
    body += svg_lines({"run": (report.steps, report.run), "reference": (report.steps, report.ref)}, title="loss")
    body += svg_lines({"|relative error|": (report.steps, [abs(r) for r in report.rel])}, title="relative error",
                      hline=report.threshold)
    return _page("loss curve check", body)


def diff_html(report: DiffReport, max_rows: int = 500, title: str | None = None) -> str:
    d = report.to_dict()
    fd = d["first_divergence"]
    body = "".join(f"<p><b>Note</b>: {html.escape(note)}</p>" for note in d["notes"])
    body += f"<p>{d['n_ops']} ops: {d['n_passed']} pass, {d['n_failed']} fail, {d['n_skipped']} skipped.</p>"
    if fd:
        body += (f"<p><b>First divergence</b>: {html.escape(fd['op'])} #{fd['index']} ({fd['phase']}, module "
                 f"{html.escape(str(fd['module']))}): {html.escape(fd['rule'])}: {html.escape(fd['detail'])}</p>")
    rel = [(r["index"], r.get("max_rel")) for r in report.ops if isinstance(r.get("max_rel"), float)]
    if rel:
        body += svg_lines({"max relative error": ([i for i, _ in rel], [v for _, v in rel])}, log_y=True,
                          title="max relative error per op (log scale)")
    cols = ("index", "op", "phase", "module", "status", "rule", "max_abs", "max_rel", "cosine", "max_ulp", "detail")
    rows = "".join(
        f"<tr class='{r['status']}'>" + "".join(f"<td>{html.escape(_fmt(r.get(c)))}</td>" for c in cols) + "</tr>"
        for r in report.ops[:max_rows])
    body += "<table><tr>" + "".join(f"<th>{c}</th>" for c in cols) + f"</tr>{rows}</table>"
    return _page(title or f"capture comparison: {report.dump_a} vs {report.dump_b}", body)


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.3g}"
    return "" if v is None else str(v)
