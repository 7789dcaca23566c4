"""Sizes, iteration scaling, statistics and the JSON record of `dicomm-bench`."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
_UNITS = {"": 1, "B": 1, "K": KIB, "KB": KIB, "KIB": KIB, "M": MIB, "MB": MIB, "MIB": MIB,
          "G": GIB, "GB": GIB, "GIB": GIB}

# Fields every record carries (the JSON schema the smoke test checks).
RECORD_FIELDS = ("backend", "op", "bytes", "lat_us_min", "lat_us_median", "lat_us_p99", "gbps",
                 "iters", "world_size", "transport", "api", "verified")


def parse_size(text: str) -> int:
    """'8', '4K', '64MiB', '256M' -> bytes (binary units)."""
    m = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in _UNITS:
        raise ValueError(f"bad size {text!r}: expected a number with an optional unit "
                         f"(B, K/KiB, M/MiB, G/GiB), e.g. 8, 4K, 256M")
    return int(m.group(1)) * _UNITS[m.group(2).upper()]


def format_size(n: int) -> str:
    for unit, scale in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def size_range(lo: int, hi: int, step: int = 2, align: int = 1) -> list[int]:
    """Geometric sizes lo, lo*step, ... up to hi, each a multiple of `align`."""
    if lo <= 0 or hi < lo or step < 2:
        raise ValueError(f"bad size range {lo}..{hi} step {step}: "
                         f"need 0 < min <= max and step >= 2")
    sizes, n = [], lo
    while n <= hi:
        sizes.append(max(align, n - n % align))
        n *= step
    return sorted(set(sizes))


@dataclass
class IterPlan:
    """Iterations of a size: `iters`, fewer when that moves over `budget` bytes, >= `min_iters`."""
    iters: int
    warmup: int
    budget: int
    min_iters: int = 5

    def iters_for(self, nbytes: int) -> int:
        return max(self.min_iters, min(self.iters, self.budget // max(1, nbytes)))

    def warmup_for(self, nbytes: int) -> int:
        return max(1, min(self.warmup, self.iters_for(nbytes) // 4))


def percentile(sorted_vals: list[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values (q in 0..100)."""
    if not sorted_vals:
        return math.nan
    k = max(0, min(len(sorted_vals) - 1, math.ceil(q / 100.0 * len(sorted_vals)) - 1))
    return sorted_vals[k]


@dataclass
class Record:
    backend: str
    op: str
    bytes: int
    lat_us_min: float
    lat_us_median: float
    lat_us_p99: float
    gbps: float
    iters: int
    world_size: int
    transport: str
    api: str
    verified: bool
    extra: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        d = {k: getattr(self, k) for k in RECORD_FIELDS}
        d.update(self.extra)
        return d


def summarize(samples_ns: list[int], scale: float = 1.0) -> tuple[float, float, float]:
    """(min, median, p99) in microseconds of samples in ns, each multiplied by `scale`."""
    vals = sorted(s * scale / 1e3 for s in samples_ns)
    n = len(vals)
    median = vals[n // 2] if n % 2 else 0.5 * (vals[n // 2 - 1] + vals[n // 2])
    return vals[0], median, percentile(vals, 99.0)


@dataclass
class RunConfig:
    """What every rank needs to know (pickled to the ranks)."""
    kind: str                 # "p2p" | "coll"
    specs: list               # BackendSpec, in interleaving order
    sizes: list[int]
    plan: IterPlan
    rounds: int = 3           # iterations of a size are split into rounds, backends alternating
    ops: tuple[str, ...] = ()  # coll only
    op_timeout: float = 300.0  # seconds: every group's and store's timeout
    progress: bool = True
