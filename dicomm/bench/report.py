"""Console/markdown tables, the JSON file, PNG curves and the issue's four targets."""
from __future__ import annotations

import json
import math
import sys

from dicomm.bench.stats import MIB, RECORD_FIELDS, format_size

SCHEMA = "dicomm-bench/1"


def _key(r: dict) -> tuple:
    return r["backend"], r["op"], r["bytes"]


def index(records: list[dict]) -> dict:
    return {_key(r): r for r in records}


def table(records: list[dict], sizes: list[int] | None = None, markdown: bool = False) -> str:
    """One row per record, grouped by op and size; the last column is gloo's median / this one's."""
    idx = index(records)
    head = ["op", "size", "backend", "transport", "iters", "min us", "median us", "p99 us",
            "GB/s", "speed-up vs gloo"]
    rows = []
    for r in records:
        if sizes and r["bytes"] not in sizes:
            continue
        g = idx.get(("gloo", r["op"], r["bytes"]))
        vs = "" if g is None or r["backend"] in ("gloo", "memcpy") else \
            f"{g['lat_us_median'] / r['lat_us_median']:.2f}x"
        rows.append([r["op"], format_size(r["bytes"]), r["backend"], r["transport"],
                     str(r["iters"]), f"{r['lat_us_min']:.1f}", f"{r['lat_us_median']:.1f}",
                     f"{r['lat_us_p99']:.1f}", f"{r['gbps']:.3g}", vs])
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])
    widths = [max(len(x) for x in col) for col in zip(head, *rows)] if rows else map(len, head)
    fmt = "  ".join(f"{{:>{w}}}" for w in widths)
    return "\n".join([fmt.format(*head)] + [fmt.format(*row) for row in rows])


def write_json(path: str, kind: str, command: str, machine: dict, records: list[dict]) -> None:
    doc = {"schema": SCHEMA, "kind": kind, "command": command, "machine": machine,
           "fields": list(RECORD_FIELDS), "records": records}
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


def read_records(paths: list[str]) -> list[dict]:
    records: list[dict] = []
    for p in paths:
        with open(p) as f:
            doc = json.load(f)
        records += doc["records"] if isinstance(doc, dict) else doc
    return records


def plot(path: str, records: list[dict], title: str) -> None:
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("--plot needs matplotlib: pip install matplotlib "
                         "(or the project's extra: pip install -e '.[plot]')") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ops = list(dict.fromkeys(r["op"] for r in records))
    fig, axes = plt.subplots(len(ops), 2, figsize=(12, 4 * len(ops)), squeeze=False)
    for row, op in zip(axes, ops):
        for backend in dict.fromkeys(r["backend"] for r in records if r["op"] == op):
            rs = sorted((r for r in records if r["op"] == op and r["backend"] == backend),
                        key=lambda r: r["bytes"])
            x = [r["bytes"] for r in rs]
            style = dict(marker="o", ms=3, label=backend)
            if backend == "memcpy":
                style = dict(ls="--", color="gray", label="memcpy (local copy, ceiling)")
            row[0].plot(x, [r["lat_us_median"] for r in rs], **style)
            row[1].plot(x, [r["gbps"] for r in rs], **style)
        what = "half round-trip" if op == "p2p" else "time"
        row[0].set(xscale="log", yscale="log", xlabel="bytes", ylabel=f"median {what} (us)",
                   title=f"{op}: latency")
        row[1].set(xscale="log", yscale="log", xlabel="bytes",
                   ylabel="GB/s" + (" (bus bandwidth)" if op != "p2p" else ""),
                   title=f"{op}: bandwidth")
        for ax in row:
            ax.grid(True, which="both", alpha=0.3)
            ax.legend()
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def targets(records: list[dict]) -> list[dict]:
    """The issue's four targets, each with the medians it compares, a ratio and PASS/MISS/'n/a'."""
    idx = index(records)
    M64 = 64 * MIB

    def get(b, op, n):
        return idx.get((b, op, n))

    def check(name, a, b, field, goal, better_low):
        ra, rb = get(*a), get(*b)
        if ra is None or rb is None:
            return {"target": name, "status": "n/a", "detail": "not measured in this run"}
        ratio = ra[field] / rb[field] if rb[field] else math.inf
        ok = ratio <= goal if better_low else ratio >= goal
        unit = "us" if field.startswith("lat") else "GB/s"
        detail = (f"{a[0]} {ra[field]:.3f} {unit} / {b[0]} {rb[field]:.3f} {unit} = {ratio:.3f} "
                  f"(goal {'<=' if better_low else '>='} {goal:.3g})")
        return {"target": name, "status": "PASS" if ok else "MISS", "ratio": ratio,
                "detail": detail}

    t4a = check("4a. tcp 8 B latency <= gloo", ("dicomm-tcp", "p2p", 8), ("gloo", "p2p", 8),
                "lat_us_median", 1.0, True)
    t4b = check("4b. tcp 64 MiB bandwidth >= gloo", ("dicomm-tcp", "p2p", M64),
                ("gloo", "p2p", M64), "gbps", 1.0, False)
    return [
        check("1. p2p 8 B median <= 1/3 gloo", ("dicomm", "p2p", 8), ("gloo", "p2p", 8),
              "lat_us_median", 1 / 3, True),
        check("2. p2p 64 MiB bandwidth >= 2.5x gloo", ("dicomm", "p2p", M64),
              ("gloo", "p2p", M64), "gbps", 2.5, False),
        check("3. all_reduce 64 MiB fp32 time <= 1/2 gloo", ("dicomm", "all_reduce", M64),
              ("gloo", "all_reduce", M64), "lat_us_median", 0.5, True),
        t4a, t4b,
    ]


def print_targets(records: list[dict], markdown: bool = False, out=sys.stdout) -> list[dict]:
    res = targets(records)
    if markdown:
        print("| target | status | measured |\n|---|---|---|", file=out)
        for t in res:
            print(f"| {t['target']} | {t['status']} | {t['detail']} |", file=out)
    else:
        print("targets (medians; ratio = dicomm / gloo):", file=out)
        for t in res:
            print(f"  {t['status']:>4}  {t['target']:<44} {t['detail']}", file=out)
    ceiling = index(records).get(("memcpy", "p2p", 64 * MIB))
    if ceiling:
        print(f"\ncontext: a local memcpy of 64 MiB ran at {ceiling['gbps']:.2f} GB/s in the same "
              f"run (memory bandwidth left to the benchmark by the rest of the machine)", file=out)
    return res
