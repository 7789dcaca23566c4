"""HeteroPP's real-run features measured on this host: per-rank memory when loading HF weights, the cost of
checkpointing, HeteroAuto's memory model against measured peaks, and a token file against synthetic tokens.

Every run is the engine's own worker (`heteropp.engine.worker.worker`) in processes started by torch's
elastic launcher (as `heteropp run` does), gloo between stages, on a random-weight HuggingFace LLaMA
directory written here by `transformers` (nothing is downloaded). Each rank runs the worker inside a thin
wrapper that reads /proc/self/status and getrusage around it and timestamps each step's log call, so the
numbers come from outside the engine:
- load: VmRSS of the freshly forked rank before anything (the idle torch process, the baseline) and right
  before the stage is built (process groups up); then what the parameters' seed initialisation added, the
  peak (VmHWM) while the slices are read from the safetensors, and what stays after loading; the stage's
  parameter bytes (its shard), and the run's ru_maxrss after one step (what the step log's
  peak_memory_gb reports on CPU); plans of 1 (the whole model in one rank), 2 and 4 stages.
- save: one plan trained --steps steps with no checkpoints, with an async save every --save-every steps, and
  with synchronous saves (TrainOptions.async_save=False); the window is from the end of step 1 to the end
  of training including the wait for the last save, so every save's whole cost (blocking part, background
  writing, final wait) is inside it; also median and mean step intervals (log call to log call) and the
  CPU time of all ranks over the window. With --rounds the runs repeat, each round starting at another
  run, and the table shows medians over rounds.
- memory: the same plan, --memory-steps steps, peak per stage (ru_maxrss of its ranks minus the rank's
  resident set right before its stage was built: the interpreter, torch and the process groups, which a
  chip's memory reserve covers; what the step log's peak_memory_gb reports on CPU) in fp32 and bf16 against
  `simulate_plan`'s `peak_memory_bytes` (HeteroAuto's memory model, analytic profile), on the medium model and
  the big one (the fixed part of a process's memory shows against 5x the weights).
- data: the no-checkpoint run against the same plan reading a token file (`heteropp data prepare` of the
  repository's docs with a tokenizer trained on them).

    python -m bench.heteropp_realrun [--only load,save,memory,data] [--steps 150] [--save-every 50] [--rounds 1]
                                     [--memory-steps 10] [--json FILE]
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from heteropp.plan import Plan, StagePlan

from .heteropp_bench_common import command, machine, table, write_json

# Weights dominate: ~110 M parameters (442 MB in fp32), two thirds of them the embedding and the head.
BIG = dict(hidden_size=1024, intermediate_size=1024, num_hidden_layers=8, num_attention_heads=8,
           num_key_value_heads=2, vocab_size=32000)
# Fast enough for a hundred steps a run on two shared cores: ~19 M parameters, checkpoints of ~230 MB.
MEDIUM = dict(hidden_size=512, intermediate_size=1376, num_hidden_layers=4, num_attention_heads=8,
              num_key_value_heads=4, vocab_size=8192)
SMOKE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=512)
SEQ_LEN = 64
GB = 1e9


def write_hf(directory: Path, fields: dict[str, Any], seed: int = 0) -> Path:
    """A random-weight LLaMA directory (config.json + model.safetensors) saved by transformers."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    config = AutoConfig.for_model(model_type="llama", max_position_embeddings=SEQ_LEN, rope_theta=10000.0,
                                  rms_norm_eps=1e-5, tie_word_embeddings=False, **fields)
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config).float().save_pretrained(directory, max_shard_size="10GB")
    return directory


def _status() -> dict[str, float]:
    """VmRSS, VmHWM, RssAnon and RssFile of this process in bytes (RssFile: mapped file pages, the
    safetensors pages a rank has touched among them)."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:", "RssAnon:", "RssFile:")):
                k, v = line.split(":", 1)
                out[k] = float(v.split()[0]) * 1024
    return out


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)  # all threads: DCP's background writer too
    return r.ru_utime + r.ru_stime


def _rank(cfg: Any) -> dict[str, Any]:
    """One rank: the engine's worker with timestamps and memory readings around it (runs in a launched process)."""
    import heteropp.engine.build as b
    import heteropp.engine.checkpoint as ck
    import heteropp.engine.worker as w
    idle = _status()
    rec: dict[str, Any] = {"rank": int(os.environ["RANK"]), "idle": idle, "log_t": [], "log_cpu": []}
    build, step = w.build_chunks, w.StepLog.step

    def timed_build(*a: Any, **k: Any) -> Any:
        rec["before_load"] = _status()  # process group and gloo groups up, no weights yet
        chunks = build(*a, **k)
        rec["after_load"] = _status()
        rec["shard_bytes"] = sum(p.numel() * p.element_size() for c in chunks for p in c.parameters())
        return chunks

    def timed_step(self: Any, *a: Any, **k: Any) -> None:
        rec["log_t"].append(time.perf_counter())
        rec["log_cpu"].append(_cpu_s())
        step(self, *a, **k)

    load = b.load_hf_weights

    def timed_load(*a: Any, **k: Any) -> Any:
        rec["after_init"] = _status()  # the stage's parameters exist (seed init), nothing read yet
        got = load(*a, **k)
        rec["after_copy"] = _status()  # every slice copied; the safetensors files are closed again
        return got

    b.load_hf_weights = timed_load
    # the training loop's time blocked in checkpointing: save() (staging; all of the writing when
    # synchronous) and wait() (a finished background save's completion, the last save at the end)
    save, wait = ck.Checkpointer.save, ck.Checkpointer.wait
    rec["save_s"], rec["wait_s"] = [], []

    def timed_save(self: Any, *a: Any, **k: Any) -> None:
        t0 = time.perf_counter()
        wait(self)  # the previous save's end, so that save()'s own wait below returns at once
        t1 = time.perf_counter()
        save(self, *a, **k)
        rec["wait_s"].append(t1 - t0)
        rec["save_s"].append(time.perf_counter() - t1)

    def timed_wait(self: Any) -> None:
        t0 = time.perf_counter()
        wait(self)
        rec["wait_s"].append(time.perf_counter() - t0)

    ck.Checkpointer.save, ck.Checkpointer.wait = timed_save, timed_wait  # type: ignore[method-assign]
    train = w.train

    def timed_train(*a: Any, **k: Any) -> dict[str, Any]:
        out = train(*a, **k)  # returns after the last checkpoint is complete
        rec["end_t"], rec["end_cpu"] = time.perf_counter(), _cpu_s()
        return out

    w.build_chunks, w.StepLog.step, w.train = timed_build, timed_step, timed_train  # type: ignore[method-assign]
    out = w.worker(cfg)
    rec["end"] = _status()
    rec["maxrss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0
    import torch

    from heteropp.engine.metrics import peak_bytes
    rec["tensor_peak"] = peak_bytes(torch.device("cpu"))  # the step log's figure: storage above the stage's start
    res = next(iter(out.values()))
    rec["stage"], rec["losses"] = res["coord"][0], res["losses"]
    return rec


def _launch(cfg: Any, nproc: int) -> dict[int, Any]:
    """`_rank(cfg)` in `nproc` ranks through torch's elastic launcher, as heteropp.engine.launch starts the
    worker: forked from a server that imported torch and the engine once."""
    import multiprocessing as mp
    import uuid

    from torch.distributed.launcher.api import LaunchConfig, elastic_launch
    mp.get_context("forkserver").set_forkserver_preload(["torch", "torch.distributed", "heteropp.engine.worker"])
    lc = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=f"realrun-{uuid.uuid4().hex[:8]}",
                      rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0, monitor_interval=0.1,
                      start_method="forkserver")
    return elastic_launch(lc, _rank)(cfg)


def plan_of(layers: list[int], micro_batches: int, schedule: str = "1f1b") -> Plan:
    return Plan([StagePlan("cpu", 1, n, False) for n in layers], dp=1, micro_batch_size=1,
                micro_batches=micro_batches, schedule=schedule, num_layers=sum(layers))


def run(model_dir: Path, plan: Plan, steps: int, **options: Any) -> list[dict[str, Any]]:
    from heteropp.engine import RunConfig
    from heteropp.spec import load_model
    m = load_model(model_dir, SEQ_LEN)
    cfg = RunConfig(plan=plan.to_dict(), model=RunConfig.model_dict(m), steps=steps, backend="gloo",
                    chip_map={"cpu": "cpu"}, timeout_s=600, options={"init_from": str(model_dir), **options})
    got = _launch(cfg, plan.world_size)
    return [got[r] for r in sorted(got)]


def _window(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """From the end of step 1 to the end of training, on the slowest rank; intervals between log calls."""
    wall = max(r["end_t"] - r["log_t"][0] for r in ranks)
    cpu = sum(r["end_cpu"] - r["log_cpu"][0] for r in ranks)
    lead = max(ranks, key=lambda r: r["rank"])  # the last stage's
    iv = [b - a for a, b in zip(lead["log_t"], lead["log_t"][1:])]
    # in the loop only: the wait after the last step (the last save's whole write when async) apart
    blocked = max(sum(r["save_s"]) + sum(r["wait_s"][:-1]) for r in ranks)
    saves = len(lead["save_s"])
    end_wait = max(r["wait_s"][-1] if r["wait_s"] else 0.0 for r in ranks)
    return {"window_s": wall, "cpu_s": cpu, "median_step_s": statistics.median(iv), "mean_step_s": statistics.mean(iv),
            "intervals_s": iv, "final_loss": lead["losses"][-1] if lead["losses"] else None, "saves": saves,
            "blocked_s": blocked, "blocked_per_save_s": blocked / saves if saves else 0.0, "end_wait_s": end_wait}


# -- 1: memory when loading ----------------------------------------------------------------------------------
def bench_load(model_dir: Path, plans: dict[str, Plan]) -> tuple[list[list[Any]], list[dict[str, Any]]]:
    """Per rank, in GB: the stage's parameters, the idle rank, then what each phase of building the stage
    added over the rank before loading (process group up): the seed initialisation of the parameters, the
    peak while reading the slices, what stays after loading."""
    rows, recs = [], []
    for name, plan in plans.items():
        for r in run(model_dir, plan, 1):
            idle, pre = r["idle"]["VmRSS"], r["before_load"]["VmRSS"]
            init, peak, after = r["after_init"]["VmRSS"], r["after_copy"]["VmHWM"], r["after_load"]["VmRSS"]
            rows.append([name, r["stage"], r["shard_bytes"] / GB, idle / GB, pre / GB, (init - pre) / GB,
                         (peak - pre) / GB, (after - pre) / GB, (peak - pre) / r["shard_bytes"], r["maxrss"] / GB])
            recs.append({"plan": name, "stage": r["stage"], "shard_bytes": r["shard_bytes"], "idle_rss": idle,
                         "before_load_rss": pre, "after_init": r["after_init"], "after_copy": r["after_copy"],
                         "after_load": r["after_load"], "maxrss_after_step": r["maxrss"]})
    return rows, recs


# -- 3: HeteroAuto's memory model ----------------------------------------------------------------------------
def predicted_peaks(model_dir: Path, plan: Plan, dtype: str) -> list[float]:
    from heteropp.auto.analytic import analytic_profile
    from heteropp.auto.costs import CostModel
    from heteropp.auto.plan_sim import simulate_plan
    from heteropp.spec import TrainSpec, load_model
    from heteropp.spec.cluster import ChipType, Cluster
    m = load_model(model_dir, SEQ_LEN)
    chip = ChipType("cpu", count=64, memory_gb=64, peak_tflops=0.1, chips_per_node=64, tp_max=4,
                    intra_node_bw=1.0, network_bw=1.0)
    train = TrainSpec(global_batch=plan.global_batch, micro_batch_size=plan.micro_batch_size, dtype=dtype,
                      zero1=True, schedule=plan.schedule)
    cl = Cluster("local", (chip,))
    cm = CostModel(cl, m, train, analytic_profile(cl, m, train))
    return list(simulate_plan(cm, plan).peak_memory_bytes)


def stage_peaks(ranks: list[dict[str, Any]], stages: int) -> list[dict[str, float]]:
    """Per stage, its largest rank: ru_maxrss, the idle baseline, and the resident set right after loading."""
    out = []
    for k in range(stages):
        mine = [r for r in ranks if r["stage"] == k]
        top = max(mine, key=lambda r: r["maxrss"] - r["before_load"]["VmRSS"])
        out.append({"maxrss": top["maxrss"], "idle": top["idle"]["VmRSS"], "before_load": top["before_load"]["VmRSS"],
                    "after_load_hwm": top["after_load"]["VmHWM"], "shard_bytes": top["shard_bytes"],
                    "tensor_peak": max(r["tensor_peak"] for r in mine)})
    return out


# -- 4: token file -------------------------------------------------------------------------------------------
def token_file(tmp: Path, vocab: int) -> Path:
    """A tokenizer of `vocab` ids trained on the repository's docs, and those docs prepared as a token file."""
    docs = sorted(str(p) for p in (Path(__file__).resolve().parent.parent / "docs").glob("*.md"))
    py = [sys.executable, "-m", "heteropp"]
    tok, out = tmp / "tokenizer.json", tmp / "docs.tok"
    subprocess.run(py + ["data", "train-tokenizer", "--out", str(tok), "--vocab-size", str(vocab), *docs],
                   check=True, capture_output=True)
    subprocess.run(py + ["data", "prepare", "--tokenizer", str(tok), "--out", str(out), "--quiet", *docs],
                   check=True, capture_output=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.heteropp_realrun", description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="load,save,memory,data", help="comma-separated: load, save, memory, data")
    ap.add_argument("--steps", type=int, default=150, help="steps of each save/data run")
    ap.add_argument("--save-every", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=1, help="rounds of the save/data runs (medians over rounds)")
    ap.add_argument("--memory-steps", type=int, default=10, help="steps of each fp32/bf16 memory run")
    ap.add_argument("--micro-batches", type=int, default=4)
    ap.add_argument("--smoke", action="store_true", help="a toy model and few steps (a seconds-long check)")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    parts = a.only.split(",")
    if bad := [p for p in parts if p not in ("load", "save", "memory", "data")]:
        ap.error(f"unknown --only part(s) {bad}; expected some of load, save, memory, data")
    if a.steps < 2 or a.save_every < 1 or a.rounds < 1 or a.memory_steps < 1:
        ap.error(f"--steps must be >= 2, --save-every, --rounds and --memory-steps >= 1, got {a.steps}, "
                 f"{a.save_every}, {a.rounds} and {a.memory_steps}")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    big, medium = (SMOKE, SMOKE) if a.smoke else (BIG, MEDIUM)
    before = machine()
    out: dict[str, Any] = {"machine_before": before, "command": command("bench.heteropp_realrun", argv),
                           "seq_len": SEQ_LEN}
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        if "load" in parts:
            d = write_hf(tmp / "big", big)
            layers = big["num_hidden_layers"]
            plans = {"1 stage": plan_of([layers], 1), "2 stages": plan_of([layers // 2] * 2, 2),
                     "4 stages": plan_of([layers // 4] * 4, 4)}
            if a.smoke:  # seconds: one launch
                plans = {"2 stages": plans["2 stages"]}
            rows, recs = bench_load(d, plans)
            print(f"load: {big}, safetensors {(d / 'model.safetensors').stat().st_size / GB:.3f} GB, "
                  f"load {os.getloadavg()}")
            print(table(["plan", "stage", "shard GB", "idle RSS GB", "RSS before load GB", "+ seed init GB",
                         "+ peak while reading GB", "+ after load GB", "peak / shard", "ru_maxrss after 1 step GB"],
                        rows))
            out["load"] = {"model": big, "file_bytes": (d / "model.safetensors").stat().st_size, "ranks": recs}
            shutil.rmtree(d)
        if {"save", "memory", "data"} & set(parts):
            d = write_hf(tmp / "medium", medium)
            layers = medium["num_hidden_layers"]
            plan = plan_of([layers // 2] * 2, a.micro_batches)
            out["plan"] = plan.to_dict()
            out["model"] = medium
        names = (["none"] if {"save", "data"} & set(parts) else []) + (["async", "sync"] if "save" in parts else []) \
            + (["token file"] if "data" in parts else [])
        runs: dict[str, list[list[dict[str, Any]]]] = {n: [] for n in names}
        data = str(token_file(tmp, medium["vocab_size"])) if "data" in parts else None
        for i in range(a.rounds if names else 0):
            for name in names[i % len(names):] + names[:i % len(names)]:  # each round starts at another run
                ck = tmp / f"ckpt-{name}-{i}"
                opts = {"none": {}, "token file": {"data": data},
                        "async": {"checkpoint_dir": str(ck), "save_every": a.save_every, "async_save": True},
                        "sync": {"checkpoint_dir": str(ck), "save_every": a.save_every, "async_save": False}}[name]
                runs[name].append(run(d, plan, a.steps, **opts))
                if ck.exists():
                    last = sorted(ck.iterdir())[-1]
                    out["checkpoint_bytes"] = sum(p.stat().st_size for p in last.iterdir())
                    shutil.rmtree(ck)
        if runs:
            per = {k: [_window(r) for r in v] for k, v in runs.items()}
            fields = ("window_s", "cpu_s", "median_step_s", "mean_step_s", "blocked_per_save_s", "end_wait_s")
            w = {k: {f: statistics.median(x[f] for x in v) for f in fields} for k, v in per.items()}
            base = w["none"]
            # one save's blocking time against the save_every steps it is spread over, within the same run
            rows = [[k, per[k][0]["final_loss"], per[k][0]["saves"], w[k]["median_step_s"] * 1e3,
                     w[k]["mean_step_s"] * 1e3, w[k]["blocked_per_save_s"],
                     f"{100 * w[k]['blocked_per_save_s'] / (a.save_every * w[k]['median_step_s']):.1f}%",
                     w[k]["end_wait_s"], w[k]["window_s"], f"{100 * (w[k]['window_s'] / base['window_s'] - 1):+.1f}%",
                     w[k]["cpu_s"],
                     f"{100 * (w[k]['cpu_s'] / base['cpu_s'] - 1):+.1f}%"] for k in names]
            print(f"{a.steps} steps, save every {a.save_every} steps, checkpoint "
                  f"{out.get('checkpoint_bytes', 0) / GB:.3f} GB, medians of {a.rounds} round(s); "
                  f"load {os.getloadavg()}")
            print(table(["run", "final loss", "saves", "median step ms", "mean step ms", "blocked s per save",
                         f"blocked / {a.save_every} median steps", "last wait s", "window s", "window vs none",
                         "CPU s (all ranks)", "CPU vs none"], rows))
            out["runs"] = {k: {**w[k], "rounds": [{**x, "ranks": r} for x, r in zip(per[k], runs[k])]}
                           for k in names}
        if "memory" in parts:
            sizes = {"medium": (d, plan)}
            if not a.smoke:  # the fixed part of a process's memory shows against a model of 5x the weights
                db = write_hf(tmp / "big", big)
                sizes["big"] = (db, plan_of([big["num_hidden_layers"] // 2] * 2, a.micro_batches))
            mem, rows = {}, []
            for size, (md, mplan) in sizes.items():
                for dtype in ("fp32", "bf16"):
                    ranks = run(md, mplan, a.memory_steps, dtype=dtype)
                    meas, pred = stage_peaks(ranks, len(mplan.stages)), predicted_peaks(md, mplan, dtype)
                    mem[f"{size} {dtype}"] = {"measured": meas, "predicted_bytes": pred}
                    for k, (x, p) in enumerate(zip(meas, pred)):
                        net = x["maxrss"] - x["before_load"]
                        params = x["shard_bytes"] / (4 if dtype == "fp32" else 2)
                        tp = x["tensor_peak"]
                        rows.append([size, dtype, k, params / 1e6, p / GB, tp / GB, f"{100 * (p / tp - 1):+.1f}%",
                                     net / GB, f"{100 * (p / net - 1):+.1f}%", (net - p) / 1e6])
            print(f"memory model vs measured after {a.memory_steps} steps (tensor peak: the step log's figure, "
                  f"storage counted by ditorch's CPU allocator layer above what the rank held before its stage "
                  f"was built; RSS: ru_maxrss minus the rank's RSS then); load {os.getloadavg()}")
            print(table(["model", "dtype", "stage", "params M", "predicted GB", "tensor peak GB",
                         "predicted vs tensor peak", "RSS (peak - before) GB", "predicted vs RSS",
                         "RSS - predicted MB"], rows))
            out["memory"] = mem
    after = machine()
    print(f"nproc {before['nproc']}, {before['cpu']}, load {before['loadavg']} -> {after['loadavg']}")
    out["machine_after"] = after
    write_json(a.json, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
