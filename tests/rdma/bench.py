"""dicomm-bench over verbs next to perftest, in one Soft-RoCE guest run:

    .venv/bin/python -m tests.rdma.bench [--json FILE]

Boots the guest (guest.py), runs bench_session.sh there (perftest ib_write_lat / ib_write_bw and
`dicomm-bench p2p --transport verbs` on the same rxe0) and prints the comparison. Under QEMU TCG
the numbers show relative overhead, not what the hardware would do.
"""
from __future__ import annotations

import argparse
import json
import sys

from tests.rdma import guest, lab, perftest


def _records(files: dict, name: str) -> list[dict]:
    text = files.get(name)
    return json.loads(text)["records"] if text else []


def _perftest(files: dict, name: str, parse) -> float | None:
    try:
        return parse(files.get(name, ""))
    except AssertionError:
        return None


def compare(files: dict) -> list[dict]:
    """One entry per round: perftest's 8 B typical latency and 1 MiB bandwidth, and dicomm-bench's
    median half round trip (8 B) and bandwidth at the median (1 MiB), with the ratios."""
    rounds = []
    for r in range(1, 100):
        if f"dicomm_{r}.rc" not in files:
            break
        lat = _perftest(files, f"write_lat_{r}.txt", perftest.lat_typical_us)
        bw = _perftest(files, f"write_bw_1m_{r}.txt", perftest.bw_average_mbps)
        row = {"round": r, "ib_write_lat_8B_typical_us": lat, "ib_write_bw_1MiB_MBps": bw}
        for rec in _records(files, f"dicomm_{r}.json"):
            key = rec["backend"]
            ok = rec["verified"] and rec["transport"] == "verbs"
            if rec["bytes"] == 8:
                row[f"{key} 8B median_us"] = rec["lat_us_median"]
                row[f"{key} 8B ratio"] = rec["lat_us_median"] / lat if lat else None
            else:
                mbps = rec["bytes"] / rec["lat_us_median"]
                row[f"{key} 1MiB MBps"] = mbps
                row[f"{key} 1MiB ratio"] = mbps / bw if bw else None
            row["verified"] = row.get("verified", True) and ok
        rounds.append(row)
    return rounds


def table(rounds: list[dict]) -> str:
    def f(v, fmt):
        return "-" if v is None else format(v, fmt)

    apis = [("dicomm-native-verbs", "native (C++ loop)"), ("dicomm-raw-verbs", "raw (Python)"),
            ("dicomm-verbs", "torch")]
    lines = ["| round | `ib_write_lat -s 8` typical | " + " | ".join(f"{n} 8 B | ratio" for _, n in apis)
             + " | `ib_write_bw -s 1M` | " + " | ".join(f"{n} 1 MiB | ratio" for _, n in apis) + " |",
             "|---" * (3 + 4 * len(apis)) + "|"]
    for r in rounds:
        cells = [f"| {r['round']}", f(r["ib_write_lat_8B_typical_us"], ".2f") + " us"]
        for key, _ in apis:
            cells += [f(r.get(f"{key} 8B median_us"), ".1f") + " us", f(r.get(f"{key} 8B ratio"), ".2f") + "x"]
        cells.append(f(r["ib_write_bw_1MiB_MBps"], ".1f") + " MB/s")
        for key, _ in apis:
            cells += [f(r.get(f"{key} 1MiB MBps"), ".1f") + " MB/s", f(r.get(f"{key} 1MiB ratio"), ".2f")]
        lines.append(" | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="write the comparison as JSON")
    ap.add_argument("--lat-iters", type=int, default=1000, help="8 B iterations of both per round (default 1000)")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    args = ap.parse_args()
    if why := lab.unavailable_reason():
        print(f"Soft-RoCE lab unavailable: {why}", file=sys.stderr)
        return 2
    res = guest.run(f"LAT_ITERS={args.lat_iters} ROUNDS={args.rounds} bash tests/rdma/bench_session.sh", timeout_s=600)
    if res.rc != 0:
        print(res.describe(), file=sys.stderr)
        return 1
    print(res.output, file=sys.stderr)
    rounds = compare(res.files)
    print(f"guest run {res.seconds:.0f} s")
    print(table(rounds))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"guest_seconds": round(res.seconds), "rounds": rounds}, f, indent=1)
    return 0 if rounds and all(r.get("verified") for r in rounds) else 1


if __name__ == "__main__":
    sys.exit(main())
