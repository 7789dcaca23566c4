"""The main job: profile the tiny model here, plan it with HeteroAuto for a two-chip-type cluster, train the
plan as a heterogeneous pipeline, train the single-process reference, and compare the loss curves.

Processes on this host stand in for the chips of two types ("big" and "small" in the cluster spec); the
small chip's profile is the measured one slowed down by the ratio of the two chips' peak TFLOPS.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
from pathlib import Path

from .cli import DEFAULT_BACKEND, parse_chip_map, run_plan

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _say(msg: str) -> None:
    print(f"[demo] {msg}", flush=True)


def profile(cluster_path: str, model: str, train_path: str, out: str, analytic: bool) -> str | None:
    """Measure the fastest chip of each device the cluster names (`device` in its spec: cpu, cuda, ...) on
    that device here, at the training spec's micro-batch size and every TP size the planner may use, and
    derive the other chips of that device from their peak-TFLOPS ratio."""
    if analytic:
        return None
    from .auto.profiler import profile_model
    from .auto.profiles import ChipProfile
    from .auto.space import usable_tp_sizes
    from .spec import load_cluster, load_model, load_train
    cl, m = load_cluster(cluster_path), load_model(model)
    micro_batch_size = load_train(train_path, m.seq_len).micro_batch_size
    prof = None
    for device in dict.fromkeys(c.device for c in cl.chips):  # cluster order, each device once
        chips = [c for c in cl.chips if c.device == device]
        fastest = max(chips, key=lambda c: c.peak_tflops)
        tps = sorted({t for c in chips for t in usable_tp_sizes(c, m)})
        got = profile_model(model, tps, device=device, chip=fastest.name, micro_batch_size=micro_batch_size,
                            repeats=2, progress=lambda m: None)
        measured = got.chips[fastest.name].tp
        if prof is None:
            prof = got
        prof.chips[fastest.name] = got.chips[fastest.name]
        prof.meta.setdefault("devices", {})[fastest.name] = got.meta.get("device", device)
        for c in chips:
            if c.name != fastest.name:
                slow = fastest.peak_tflops / c.peak_tflops
                prof.chips[c.name] = ChipProfile({t: dataclasses.replace(
                    p, fwd_s=p.fwd_s * slow, bwd_s=p.bwd_s * slow, recompute_s=p.recompute_s * slow,
                    wgrad_s=p.wgrad_s * slow, head_s=p.head_s * slow) for t, p in measured.items()})
    prof.save(out)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m heteropp.demo", description=__doc__.splitlines()[0])
    ap.add_argument("--cluster", default=str(EXAMPLES / "clusters" / "two-cpu.yaml"))
    ap.add_argument("--train", default=str(EXAMPLES / "training" / "tiny.yaml"))
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--backend", choices=("dicomm", "gloo"), default=DEFAULT_BACKEND)
    ap.add_argument("--analytic", action="store_true", help="plan from the analytic profile instead of measuring")
    ap.add_argument("--out", help="folder for the plan, profile and loss logs (default: a temporary one)")
    a = ap.parse_args(argv)
    t_start = time.perf_counter()
    out = Path(a.out or tempfile.mkdtemp(prefix="heteropp-demo-"))
    out.mkdir(parents=True, exist_ok=True)

    from .auto import plan as heteroauto_plan
    from .auto.planning import load_problem
    from .spec import load_model
    _say(f"1/4 profiling the {a.model} model on this host's devices" + (" (skipped: analytic)" if a.analytic else ""))
    t0 = time.perf_counter()
    prof = profile(a.cluster, a.model, a.train, str(out / "profile.json"), a.analytic)
    t_prof = time.perf_counter() - t0

    _say("2/4 planning with HeteroAuto")
    pb = load_problem(a.cluster, a.model, a.train, prof)
    plan = heteroauto_plan(pb).plan
    plan.save(out / "plan.json")
    for i, s in enumerate(plan.stages):
        _say(f"    stage {i}: {s.chip:>6} tp {s.tp} layers {s.first_layer}-{s.first_layer + s.layers - 1}"
             f"{' recompute' if s.recompute else ''}")
    _say(f"    dp {plan.dp}, {plan.micro_batches} micro-batches of {plan.micro_batch_size}, {plan.schedule}, "
         f"{plan.world_size} processes; predicted {plan.iteration_time_s * 1e3:.1f} ms/iteration")

    _say(f"3/4 training the plan ({a.steps} steps, {a.backend} between stages)")
    m = load_model(a.model)
    run_log, ref_log = str(out / "run.jsonl"), str(out / "reference.jsonl")
    run = run_plan(plan, m, steps=a.steps, backend=a.backend, chip_map=parse_chip_map(None, pb.cluster),
                   loss_log=run_log)

    _say("4/4 training the single-process reference and comparing loss curves")
    from .engine import train_reference
    t0 = time.perf_counter()
    ref = train_reference(m, a.steps, plan.global_batch, loss_log=ref_log, verbose=False)
    t_ref = time.perf_counter() - t0
    import ditorch_precision
    report = ditorch_precision.loss_check(run_log, ref_log)

    steady = sorted(run["tokens_per_s"][1:] or run["tokens_per_s"])
    print()
    print("HeteroPP demo summary")
    print(f"  plan            {' | '.join(f'{s.chip} tp{s.tp} x{s.layers}' for s in plan.stages)}, dp {plan.dp}")
    print(f"  profile         {'analytic' if a.analytic else f'measured here ({t_prof:.1f} s)'}")
    print(f"  loss            step 1 {run['losses'][0]:.6f} -> step {a.steps} {run['losses'][-1]:.6f} "
          f"(reference {ref['losses'][-1]:.6f})")
    print(f"  loss check      MRE {report.mre:.2e}, max rel {report.max_rel:.2e} "
          f"(threshold {report.threshold:.1%}): {'PASS' if report.passed else 'FAIL'}")
    print(f"  throughput      pipeline {steady[len(steady) // 2]:.0f} tokens/s (median), "
          f"reference {a.steps * plan.global_batch * m.seq_len / t_ref:.0f} tokens/s")
    print(f"  files           {out}")
    print(f"  total time      {time.perf_counter() - t_start:.1f} s")
    return 0 if report.passed else 1


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
