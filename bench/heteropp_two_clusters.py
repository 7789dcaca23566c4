"""Measured, not only simulated: a two-stage plan across two emulated clusters (bench/heteropp_netns.py: a
network namespace per chip type, a tc-shaped link between them) under 1F1B and under H-1F1B, against
the simulator's prediction from the same run's measured stage times and the link's rate.

    python -m bench.heteropp_two_clusters [--rate 50mbit] [--steps 6] [--json FILE]

1F1B runs first with per-action timing (HETEROPP_TIMING); its median forward and backward per stage and
the link's transfer time (activation bytes / rate) give H-1F1B's extra warm-up (HARP's rule) and both
predictions; then both schedules run again, alternating, and the median step time (first step excluded)
is reported next to the prediction. Needs root, `ip` and `tc` (exits with the reason otherwise).
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from bench.heteropp_netns import Unavailable, run_across, two_clusters
from heteropp.auto.simulator import StageTimes, simulate
from heteropp.engine import RunConfig
from heteropp.plan import Plan, StagePlan
from heteropp.schedules import build, h1f1b_extra
from heteropp.spec import ModelSpec

MODEL = ModelSpec("bench-2c", layers=4, hidden=256, heads=8, kv_heads=4, ffn=512, vocab=512, seq_len=256)
_RATE = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}


def rate_bytes_s(rate: str) -> float:
    for unit, scale in _RATE.items():
        if rate.endswith(unit):
            return float(rate[: -len(unit)]) * scale / 8
    raise SystemExit(f"--rate: expected e.g. 50mbit or 1gbit, got {rate!r}")


def stage_times(timing_dir: Path) -> list[tuple[float, float]]:
    """Median forward and backward per stage, over every step but the first."""
    out: dict[int, tuple[list[float], list[float]]] = {}
    for f in timing_dir.glob("rank*.jsonl"):
        for line in f.read_text().splitlines()[1:]:
            d = json.loads(line)
            fw, bw = out.setdefault(d["stage"], ([], []))
            for op, _, t0, t1 in d["spans"]:
                (fw if op == "F" else bw if op == "B" else []).append(t1 - t0)
    return [(statistics.median(out[k][0]), statistics.median(out[k][1])) for k in sorted(out)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", default="50mbit")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--micro-batches", type=int, default=8)
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    plan = Plan([StagePlan("A", 1, 2), StagePlan("B", 1, 2)], dp=1, micro_batch_size=1,
                micro_batches=a.micro_batches, num_layers=MODEL.layers)
    cfg = lambda p, scheds: RunConfig(plan=p.to_dict(), model=RunConfig.model_dict(MODEL), steps=a.steps,  # noqa: E731
                                      schedules=scheds, backend="gloo", chip_map={"A": "cpu", "B": "cpu"},
                                      timeout_s=300)
    transfer = MODEL.seq_len * MODEL.hidden * 4 / rate_bytes_s(a.rate)
    try:
        with two_clusters(rate=a.rate) as clusters, tempfile.TemporaryDirectory() as tmp:
            timing = Path(tmp) / "timing"
            timing.mkdir()
            run_across(Path(tmp), cfg(plan, ["1f1b"]), clusters, {"HETEROPP_TIMING": str(timing)})
            fb = stage_times(timing)
            extra = h1f1b_extra([f + b for f, b in fb], [transfer])
            hplan = Plan(plan.stages, dp=1, micro_batch_size=1, micro_batches=a.micro_batches, num_layers=MODEL.layers,
                         schedule="h1f1b", schedule_params={"extra_warmup": extra})
            measured: dict[str, list[float]] = {"1f1b": [], "h1f1b": []}
            tokens = plan.global_batch * MODEL.seq_len
            for _ in range(2):  # alternate so both see the same load
                for name, steps in run_across(Path(tmp), cfg(hplan, ["1f1b", "h1f1b"]), clusters).items():
                    measured[name] += [tokens / s["tokens_per_s"] for s in steps[1:]]
            delayed = clusters[2]
    except Unavailable as e:
        print(f"skipped: {e}")
        return 0
    st = [StageTimes(f, b, 0.0, 0.0) for f, b in fb]
    predicted = {"1f1b": simulate(st, [transfer], a.micro_batches, "1f1b").iteration_time_s,
                 "h1f1b": simulate(st, [transfer], a.micro_batches,
                                   build("h1f1b", 2, a.micro_batches, {"extra_warmup": extra})).iteration_time_s}
    rows = {name: {"measured_s": statistics.median(v), "predicted_s": predicted[name]} for name, v in measured.items()}
    print(f"link {a.rate} (delay emulated: {delayed}), transfer {transfer * 1e3:.1f} ms per activation, stage F/B "
          + ", ".join(f"{f * 1e3:.1f}/{b * 1e3:.1f} ms" for f, b in fb) + f", H-1F1B extra warm-up {extra}")
    for name, r in rows.items():
        print(f"  {name:>6}: measured {r['measured_s']:.3f} s per step (median), simulated {r['predicted_s']:.3f} s")
    if a.json:
        Path(a.json).write_text(json.dumps({"rate": a.rate, "transfer_s": transfer, "stage_fb_s": fb,
                                            "extra_warmup": extra, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
