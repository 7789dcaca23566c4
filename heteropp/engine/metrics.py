"""What a person watching a long run sees: one JSON line per step (the loss log `precision-diff loss` reads,
`{"step": n, "loss": x}`, with the other fields beside it), a progress line with the ETA, and TensorBoard
scalars when `torch.utils.tensorboard` can be imported.

Fields: time (seconds since the epoch when the step ended), loss, lr, grad_norm (null unless clipping computes
it), step_s, tokens_per_s, mfu (model FLOPs per second over the plan's summed peak, when the cluster spec
gives peaks), peak_memory_gb (per stage: the largest of its ranks' peaks of tensor memory above what the rank held
before the stage was built: the accelerator's allocator peak, on CPU the same figure from ditorch's counting layer
over torch's CPU allocator, or, without it, the process's peak resident set; the interpreter, torch, the process
groups and the C heap's free lists are what a chip's memory reserve covers, not the stage) and skipped and loss_scale
(fp16: steps the loss scaler skipped so far, the scale of the next step)."""
from __future__ import annotations

import json
import os
import resource
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

from ..plan import Plan
from ..spec import ModelSpec
from .topology import Groups


def model_flops(m: ModelSpec, tokens: int) -> float:
    """Forward + backward FLOPs of one step over `tokens` tokens (backward = 2 x forward), recompute not
    counted (MFU's convention)."""
    return 3.0 * (m.layers * m.layer_flops_fwd(tokens) + m.head_flops_fwd(tokens))


_rss_before_stage = 0.0
_allocated_before_stage = 0


def resident_bytes() -> float:
    """This process's resident set now (0 where /proc is missing)."""
    try:
        with open("/proc/self/statm") as f:
            return float(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0.0


def mark_stage_start() -> None:
    """Call right before the stage's model is built: CPU peaks are counted from here."""
    global _rss_before_stage, _allocated_before_stage
    # imported here, in the worker: importing ditorch enables the host's vendor, and a device enabled in the
    # launcher's fork server (which imports this module) leaves its forked workers unable to run autograd
    from ditorch import cpu_memory
    _rss_before_stage = resident_bytes()
    if cpu_memory.install():
        cpu_memory.reset_peak()
        _allocated_before_stage = cpu_memory.allocated()


def peak_bytes(device: torch.device) -> float:
    from ditorch import cpu_memory
    if device.type != "cpu":
        try:
            return float(torch.accelerator.max_memory_allocated(device))  # type: ignore[attr-defined]
        except Exception:
            pass
    if cpu_memory.active():
        return max(0.0, float(cpu_memory.peak() - _allocated_before_stage))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0  # Linux reports KiB
    return max(0.0, peak - _rss_before_stage)



def stage_peaks(g: Groups, plan: Plan, stage: int, contributes: bool) -> list[float]:
    """Each stage's peak memory in GB, gathered on every rank (one small MAX all-reduce over the world)."""
    v = torch.zeros(plan.devices, dtype=torch.float64)
    v[stage] = peak_bytes(g.device) / 1e9
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(v, op=dist.ReduceOp.MAX)
    return v.tolist()


class StepLog:
    def __init__(self, path: str | None, start: int, m: ModelSpec, sequences: int, steps: int, label: str,
                 peak_flops: float | None, echo: bool = True) -> None:
        """`path`: the JSON-lines log (None: none); `echo`: print the progress line. A resumed run (`start` > 0)
        keeps the lines of the steps up to `start` and appends after them."""
        self.m, self.tokens, self.steps, self.label, self.peak = m, sequences * m.seq_len, steps, label, peak_flops
        self.file = None
        self.echo = echo
        self.start, self.elapsed, self.done = start, 0.0, 0
        self.tb: Any = None
        self.slow_before = False
        self.slot_names: list[str] | None = None  # the straggler watch's slots, where not plain stages
        if path is None:
            return
        kept = []
        if start > 0 and os.path.exists(path):
            with open(path) as f:
                kept = [line for line in f if line.strip() and json.loads(line).get("step", 0) <= start]
        self.file = open(path, "w")
        self.file.writelines(kept)
        try:
            from torch.utils.tensorboard import SummaryWriter
            self.tb = SummaryWriter(os.path.splitext(path)[0] + ".tb")
        except Exception:  # tensorboard not installed: JSON lines only
            self.tb = None

    def step(self, step: int, loss: float, lr: float, grad_norm: float | None, dt: float,
             peaks: list[float] | None, scaler: Any = None, stragglers: dict[int, float] | None = None) -> None:
        if self.file is None and not self.echo:
            return
        rate = self.tokens / dt
        rec: dict[str, Any] = {"step": step, "loss": loss, "lr": lr, "grad_norm": grad_norm, "step_s": round(dt, 6),
                               "tokens_per_s": round(rate, 1), "time": round(time.time(), 3)}
        if self.peak:
            rec["mfu"] = round(model_flops(self.m, self.tokens) / dt / self.peak, 6)
        if peaks is not None:
            rec["peak_memory_gb"] = [round(x, 4) for x in peaks]
        if stragglers:  # stage -> its compute time over the prediction, relative to the median stage's
            rec["stragglers"] = {str(k): round(v, 2) for k, v in stragglers.items()}
            if self.echo and not self.slow_before:
                print(f"[{self.label}] step {step}: straggler: " + ", ".join(
                    f"{self.slot_names[k] if self.slot_names else f'stage {k}'} {v:.1f}x slower than predicted, "
                    "relative to the other stages"
                    for k, v in stragglers.items()), file=sys.stderr, flush=True)
        self.slow_before = bool(stragglers)
        if scaler is not None:  # fp16: steps skipped so far and the scale the next step uses
            rec["skipped"], rec["loss_scale"] = scaler.skipped, scaler.scale
        if self.file is not None:
            self.file.write(json.dumps(rec) + "\n")
            self.file.flush()
        if self.tb is not None:
            for k in ("loss", "lr", "grad_norm", "tokens_per_s", "mfu"):
                if rec.get(k) is not None:
                    self.tb.add_scalar(k, rec[k], step)
        self.elapsed += dt
        self.done += 1
        if self.echo:
            eta = self.elapsed / self.done * (self.steps - step)
            # the first fields keep their places: scripts read "[label] step N  loss X  R tokens/s"
            print(f"[{self.label}] step {step:4d}  loss {loss:.6f}  {rate:9.0f} tokens/s  lr {lr:.3g}"
                  f"  {step}/{self.steps}, eta {eta:.0f} s", file=sys.stdout, flush=True)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
        if self.tb is not None:
            self.tb.close()
