"""Elastic training with a straggler: how fast a throttled host is noticed, judged and re-planned around, and
what the step time is before, during and after.

Each repetition starts `heteropp run --elastic` for the tiny model over two emulated hosts (2 `big` + 2 `small`
processes on loopback, examples/clusters/two-cpu.yaml, as bench.heteropp_elastic's loopback variant), and after
step 3 throttles the `small` host (its torch elastic agent and workers, and the workers it starts later) to
`--share` of one core with a cpu cgroup (v1, root); the run has `--timeout 120`, as its restarted workers are
slow to join. From the run's records (elastic.jsonl, the loss log) and the throttle time measured here:

- flagged: the first step logged with a straggler - throttle
- verdict: the `straggler` event that chose to re-plan - throttle (earlier verdicts not to are counted)
- re-plan to first step: the first step of the round after that verdict - the verdict
- step time: median before the throttle, at the verdict (the window's median), after the re-plan

    python -m bench.heteropp_elastic_straggler [--reps 3] [--share 0.1] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from heteropp.engine.elastic_launch import CPU_CGROUP, release_host, throttle_host

from .heteropp_elastic import Run, _lines, _wait, median_of, steps_of

KEYS = ("flagged_s", "verdict_s", "replan_to_first_step_s", "slowdown", "gain_s", "cost_s", "step_s_before",
        "step_s_throttled", "step_s_after", "verdicts_not_to")


def one(steps: int, every: int, share: float) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="heteropp-straggler-"))
    load0, cpu0 = os.getloadavg()[0], resource.getrusage(resource.RUSAGE_CHILDREN)
    t_start = time.time()
    # the throttled host's restarted workers import torch at its share of a core: their round waits for them
    # up to --timeout (30 s was too short at load 11)
    run = Run(work, "loopback", steps, every, timeout_s=120)
    row: dict[str, Any] = {"share": share}
    group = None
    try:
        ev = run.ck / "elastic.jsonl"
        _wait(lambda: len(steps_of(run.log)) >= 3, "step 3", run.main, 300)
        before = [r["step_s"] for r in steps_of(run.log)]
        group = throttle_host(run.hosts["small"][0], f"heteropp-bench-{uuid.uuid4().hex[:8]}", share)
        at = time.time()
        flagged = _wait(lambda: next((r for r in steps_of(run.log) if r["time"] > at and r.get("stragglers")), None),
                        "a step with a straggler", run.main, 300)
        verdict = _wait(lambda: next((e for e in _lines(ev) if e["event"] == "straggler" and e["replan"]), None),
                        "a verdict to re-plan", run.main, 300)
        rnd = _wait(lambda: next((e for e in _lines(ev) if e["event"] == "round" and e["started"] > verdict["time"]),
                                 None), "the round after the verdict", run.main, 300)
        first = _wait(lambda: next((r for r in steps_of(run.log) if r["time"] > rnd["time"]), None),
                      "the first step on the new plan", run.main, 300)
        _wait(run.finished, "the run's end", None, 600)
        after = [r["step_s"] for r in steps_of(run.log) if r["time"] > first["time"]]
        row.update(flagged_s=round(flagged["time"] - at, 3), verdict_s=round(verdict["time"] - at, 3),
                   replan_to_first_step_s=round(first["time"] - verdict["time"], 3),
                   slowdown=verdict["slowdown"], gain_s=verdict["gain_s"], cost_s=verdict["cost_s"],
                   step_s_before=round(statistics.median(before), 3), step_s_throttled=verdict["step_s"],
                   step_s_after=round(statistics.median(after), 3) if after else None,
                   verdicts_not_to=sum(1 for e in _lines(ev) if e["event"] == "straggler" and not e["replan"]),
                   plan_before=next(e for e in _lines(ev) if e["event"] == "round")["plan"], plan_after=rnd["plan"],
                   resume_from=rnd["resume_from"], verdict_step=verdict["step"])
    except RuntimeError as e:
        row["error"] = str(e)[:2000]
        print(f"failed: {row['error']}", flush=True)
    finally:
        run.close()
        if group is not None:
            release_host(group)
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    row.update(load_before=round(load0, 2), load_after=round(os.getloadavg()[0], 2),
               cpu_s=round(cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime, 1),
               wall_s=round(time.time() - t_start, 1), steps=steps)
    if "error" in row:
        row["kept"] = str(work)
    else:
        shutil.rmtree(work, ignore_errors=True)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3, help="repetitions (default 3)")
    ap.add_argument("--share", type=float, default=0.1, help="the throttled host's share of one core (default 0.1)")
    ap.add_argument("--steps", type=int, default=40, help="steps per run (default 40)")
    ap.add_argument("--save-every", type=int, default=4, help="checkpoint interval in steps (default 4)")
    ap.add_argument("--json", help="write every repetition and the medians here")
    a = ap.parse_args(argv)
    if a.reps < 1 or not 0 < a.share <= 1 or a.steps < 10:
        ap.error("--reps >= 1, 0 < --share <= 1 and --steps >= 10 expected")
    if not os.access(CPU_CGROUP, os.W_OK):
        print(f"skipped: needs cgroup v1's cpu controller at {CPU_CGROUP}, writable (root)")
        return 0
    rows = []
    for i in range(a.reps):
        r = one(a.steps, a.save_every, a.share)
        rows.append(r)
        print(f"#{i + 1}: " + ", ".join(f"{k} {r.get(k)}" for k in KEYS + ("load_before", "cpu_s")), flush=True)
    med = {k: median_of(rows, k) for k in KEYS + ("load_before", "cpu_s")}
    med["reps"], med["failed"] = len(rows), sum(1 for r in rows if "error" in r)
    print(f"\nmedians over {a.reps} repetitions (seconds after the throttle unless said):")
    print(" | ".join(KEYS + ("load", "cpu_s/run")))
    print(" | ".join(str(med[k]) for k in KEYS + ("load_before", "cpu_s")))
    if a.json:
        Path(a.json).write_text(json.dumps({"rows": rows, "medians": med, "share": a.share, "steps": a.steps,
                                            "save_every": a.save_every, "cores": os.cpu_count()}, indent=1))
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
