"""dicomm-bench over verbs next to perftest, in one Soft-RoCE guest run:

    .venv/bin/python -m tests.rdma.bench [--json FILE]

Boots the guest (guest.py), runs bench_session.sh there (perftest ib_write_lat / ib_write_bw and
`dicomm-bench p2p --transport verbs` on the same rxe0) and prints the comparison. Under QEMU TCG
the numbers show relative overhead, not what the hardware would do.

1 MiB bandwidth: the Communicator streaming 16 messages at a time (guest_stream.py), as ib_write_bw
streams, and each API's ping-pong (bytes per half round trip, which adds each message's handshake).
Bandwidths are in MiB/s: perftest's "MB/sec" divides by 2^20.

A process pair under TCG runs in one of a few speed modes, perftest's as much as dicomm's (8 B
typical 10.5 us in one run, 18-20 us in the next), so a round's 8 B figure is the median over
`--pairs` process pairs of each side, alternating; single pairs are listed too, and the ratio of
the two sides' fastest pairs (like modes, when each side met its fast one).
"""
from __future__ import annotations

import argparse
import json
import statistics
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


def _pairs(files: dict, r: int) -> tuple[list[float], list[float], bool]:
    """Round r's 8 B latency pairs: perftest's typical and dicomm native's median half round trip
    (us) per process pair (a perftest run without a finite row is left out), and whether every
    dicomm pair ran over verbs with its bytes verified."""
    perf, native, ok = [], [], True
    for k in range(1, 100):
        if f"dicomm_lat_{r}_{k}.rc" not in files:
            break
        lat = _perftest(files, f"write_lat_{r}_{k}.txt", perftest.lat_typical_us)
        if lat is not None:
            perf.append(lat)
        recs = [rec for rec in _records(files, f"dicomm_lat_{r}_{k}.json") if rec["bytes"] == 8]
        ok = ok and bool(recs)
        for rec in recs:
            ok = ok and rec["verified"] and rec["transport"] == "verbs"
            native.append(rec["lat_us_median"])
    return perf, native, ok


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def compare(files: dict) -> list[dict]:
    """One entry per round: perftest's 8 B typical latency (median over the round's process pairs)
    and 1 MiB bandwidth, dicomm native's 8 B median half round trip over the same number of pairs,
    and dicomm-bench's full run (native, raw, torch: 8 B median, 1 MiB bandwidth at the median),
    with the ratios."""
    rounds = []
    for r in range(1, 100):
        if f"dicomm_{r}.rc" not in files:
            break
        perf, native, pairs_ok = _pairs(files, r)
        lat = _median(perf)
        bw = _perftest(files, f"write_bw_1m_{r}.txt", perftest.bw_average_mibps)
        row = {"round": r, "ib_write_lat_8B_typical_us": lat, "ib_write_bw_1MiB_MiBps": bw,
               "ib_write_lat_8B_pairs_us": perf, "native_8B_pairs_us": native,
               "native_8B_pairs_median_us": _median(native)}
        row["native_8B_pairs_ratio"] = row["native_8B_pairs_median_us"] / lat if lat and native else None
        # The fastest pair of each side: like modes compared when both sides met their fast one.
        row["native_8B_fastest_pair_ratio"] = min(native) / min(perf) if perf and native else None
        full = _records(files, f"dicomm_{r}.json")
        stream = json.loads(files[f"dicomm_stream_{r}.json"]) if f"dicomm_stream_{r}.json" in files else {}
        row["native stream 1MiB MiBps"] = stream.get("MiBps_median")
        row["native stream 1MiB ratio"] = stream["MiBps_median"] / bw if stream and bw else None
        row["verified"] = pairs_ok and bool(full) and bool(stream.get("verified"))
        for rec in full:
            key = rec["backend"]
            ok = rec["verified"] and rec["transport"] == "verbs"
            if rec["bytes"] == 8:
                row[f"{key} 8B median_us"] = rec["lat_us_median"]
                row[f"{key} 8B ratio"] = rec["lat_us_median"] / lat if lat else None
            else:
                mibps = rec["bytes"] / rec["lat_us_median"] * 1e6 / (1 << 20)  # perftest's MB/sec is MiB/s
                row[f"{key} 1MiB MiBps"] = mibps
                row[f"{key} 1MiB ratio"] = mibps / bw if bw else None
            row["verified"] = row["verified"] and ok
        rounds.append(row)
    return rounds


def table(rounds: list[dict]) -> str:
    def f(v, fmt):
        return "-" if v is None else format(v, fmt)

    apis = [("dicomm-native-verbs", "native (C++ loop)"), ("dicomm-raw-verbs", "raw (Python)"),
            ("dicomm-verbs", "torch")]
    def each(xs):
        return ", ".join(format(x, ".1f") for x in xs) or "-"

    lines = ["| round | `ib_write_lat -s 8` typical, pairs | median | native 8 B, pairs | median | ratio | "
             "fastest pairs' ratio | "
             + " | ".join(f"{n} 8 B | ratio" for _, n in apis)
             + " | `ib_write_bw -s 1M` | native stream 1 MiB | ratio | "
             + " | ".join(f"{n} 1 MiB ping-pong | ratio" for _, n in apis) + " |",
             "|---" * (11 + 4 * len(apis)) + "|"]
    for r in rounds:
        cells = [f"| {r['round']}", each(r["ib_write_lat_8B_pairs_us"]) + " us",
                 f(r["ib_write_lat_8B_typical_us"], ".2f") + " us", each(r["native_8B_pairs_us"]) + " us",
                 f(r["native_8B_pairs_median_us"], ".2f") + " us", f(r["native_8B_pairs_ratio"], ".2f") + "x",
                 f(r["native_8B_fastest_pair_ratio"], ".2f") + "x"]
        for key, _ in apis:
            cells += [f(r.get(f"{key} 8B median_us"), ".1f") + " us", f(r.get(f"{key} 8B ratio"), ".2f") + "x"]
        cells.append(f(r["ib_write_bw_1MiB_MiBps"], ".1f") + " MiB/s")
        cells += [f(r["native stream 1MiB MiBps"], ".1f") + " MiB/s", f(r["native stream 1MiB ratio"], ".2f")]
        for key, _ in apis:
            cells += [f(r.get(f"{key} 1MiB MiBps"), ".1f") + " MiB/s", f(r.get(f"{key} 1MiB ratio"), ".2f")]
        lines.append(" | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="write the comparison as JSON")
    ap.add_argument("--lat-iters", type=int, default=1000, help="8 B iterations of both per round (default 1000)")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    ap.add_argument("--pairs", type=int, default=3, help="8 B process pairs of each side per round (default 3)")
    args = ap.parse_args()
    if args.rounds < 1 or args.pairs < 1:
        ap.error("--rounds and --pairs must be at least 1")
    if why := lab.unavailable_reason():
        print(f"Soft-RoCE lab unavailable: {why}", file=sys.stderr)
        return 2
    # A round: the full dicomm run (35-60 s), the stream (~30 s), and per pair a perftest run and a short
    # dicomm run (25-40 s).
    res = guest.run(f"LAT_ITERS={args.lat_iters} ROUNDS={args.rounds} PAIRS={args.pairs} "
                    "bash tests/rdma/bench_session.sh",
                    timeout_s=120 + args.rounds * (150 + 50 * args.pairs))
    if res.rc != 0:
        print(res.describe(), file=sys.stderr)
        return 1
    print(res.output, file=sys.stderr)
    rounds = compare(res.files)
    print(f"guest run {res.seconds:.0f} s")
    print(table(rounds))
    for key, what in (("native_8B_pairs_ratio", "medians over pairs"),
                      ("native_8B_fastest_pair_ratio", "fastest pairs")):
        ratios = [r[key] for r in rounds if r[key] is not None]
        if ratios:
            print(f"8 B native / ib_write_lat ({what}): median over rounds {statistics.median(ratios):.2f}x, "
                  f"at most 1.5x in {sum(x <= 1.5 for x in ratios)} of {len(ratios)} rounds")
    ratios = [r["native stream 1MiB ratio"] for r in rounds if r["native stream 1MiB ratio"] is not None]
    if ratios:
        print(f"1 MiB native stream / ib_write_bw: median over rounds {statistics.median(ratios):.2f}, "
              f"at least 0.8 in {sum(x >= 0.8 for x in ratios)} of {len(ratios)} rounds")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"guest_seconds": round(res.seconds), "rounds": rounds}, f, indent=1)
    return 0 if rounds and all(r.get("verified") for r in rounds) else 1


if __name__ == "__main__":
    sys.exit(main())
