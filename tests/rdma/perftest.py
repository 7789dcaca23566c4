"""Reads perftest's result rows (ib_write_lat / ib_write_bw output)."""
from __future__ import annotations

import math
import re


def row(text: str, cols: int) -> list[float]:
    """The first `cols` numbers of the last result row whose numbers are all finite. perftest prints
    inf where its own CPU-frequency measurement failed (it happens under TCG); such rows are skipped."""
    rows = []
    for line in text.splitlines():
        if not re.match(r"^\s*\d+\s+\d+\s", line):
            continue
        try:
            vals = [float(x) for x in line.split()[:cols]]
        except ValueError:
            continue
        if len(vals) == cols and all(math.isfinite(v) for v in vals):
            rows.append(vals)
    if not rows:
        raise AssertionError(f"no finite result row in perftest output:\n{text[-2000:]}")
    return rows[-1]


def lat_typical_us(text: str) -> float:
    return row(text, 5)[4]  # #bytes #iterations t_min t_max t_typical


def bw_average_mibps(text: str) -> float:
    """BW average in perftest's "MB/sec", which is MiB/s (it divides bytes per second by 0x100000)."""
    return row(text, 4)[3]  # #bytes #iterations BW peak BW average
