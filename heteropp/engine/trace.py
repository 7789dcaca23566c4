"""A per-stage timeline in Chrome's trace-event format (chrome://tracing, Perfetto) from the action spans
that `HETEROPP_TIMING=DIR` makes every rank write (DIR/rank<R>.jsonl, one line per step:
{"stage": k, "spans": [[op, micro-batch, start_s, end_s], ...]} on the host's monotonic clock)."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ..spec import SpecError

_RANK_FILE = re.compile(r"^rank(\d+)\.jsonl$")


def chrome_trace(timing_dir: str | Path) -> dict[str, Any]:
    """One process per stage, one thread per rank; each action a complete event ("ph": "X") in microseconds
    from the earliest span."""
    d = Path(timing_dir)
    files = sorted((int(m.group(1)), p) for p in d.glob("rank*.jsonl") if (m := _RANK_FILE.match(p.name)))
    if not files:
        raise SpecError(str(d), "<timing>", "no rank<R>.jsonl files", "the directory a run with HETEROPP_TIMING wrote")
    rows: list[tuple[int, int, int, str, int, float, float]] = []
    for rank, path in files:
        for n, line in enumerate(path.read_text().splitlines()):
            try:
                rec = json.loads(line)
                for op, mb, t0, t1 in rec["spans"]:
                    rows.append((int(rec["stage"]), rank, n + 1, str(op), int(mb), float(t0), float(t1)))
            except (ValueError, KeyError, TypeError) as e:
                raise SpecError(str(path), f"line {n + 1}", f"not a span record ({e})",
                                '{"stage": k, "spans": [[op, mb, start, end], ...]}') from None
    origin = min(r[5] for r in rows)
    events: list[dict[str, Any]] = []
    for stage in sorted({r[0] for r in rows}):
        events.append({"name": "process_name", "ph": "M", "pid": stage, "args": {"name": f"stage {stage}"}})
    for stage, rank in sorted({(r[0], r[1]) for r in rows}):
        events.append({"name": "thread_name", "ph": "M", "pid": stage, "tid": rank, "args": {"name": f"rank {rank}"}})
    for stage, rank, step, op, mb, t0, t1 in rows:
        events.append({"name": f"{op} {mb}", "cat": op, "ph": "X", "pid": stage, "tid": rank,
                       "ts": round((t0 - origin) * 1e6, 3), "dur": round((t1 - t0) * 1e6, 3),
                       "args": {"step": step, "micro_batch": mb}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}
