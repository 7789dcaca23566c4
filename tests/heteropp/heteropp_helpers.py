"""Shared pieces of the HeteroPP tests: a small model every TP size 1, 2, 4 divides, plan builders, one
launch per plan (cached, all schedules in it), and comparison against the single-process reference.

Processes on one host stand in for chips of two types; CPU tensors and gloo stand in for device tensors
and the vendors' collective libraries.
"""
from __future__ import annotations

import functools

import torch

from heteropp.engine import RunConfig, launch, train_reference
from heteropp.plan import Plan, StagePlan
from heteropp.spec import ModelSpec

MODEL = ModelSpec("test4", layers=4, hidden=32, heads=8, kv_heads=4, ffn=64, vocab=128, seq_len=16)
STEPS = 2
SCHEDULES = ("gpipe", "1f1b", "zbh1")
RTOL = 1e-5


def plan(stages: list[tuple[int, int, bool]], dp: int = 1, micro_batches: int = 4) -> Plan:
    """stages: (tp, layers, recompute); chips alternate between two types, A and B."""
    return Plan([StagePlan("AB"[i % 2], tp, n, rc) for i, (tp, n, rc) in enumerate(stages)], dp=dp,
                micro_batch_size=1, micro_batches=micro_batches, num_layers=MODEL.layers)


PLANS = {
    "tp2-1": plan([(2, 3, False), (1, 1, False)]),
    "tp1-2-1-rc": plan([(1, 1, True), (2, 2, False), (1, 1, False)]),
    "dp2-tp2-1": plan([(2, 3, False), (1, 1, False)], dp=2),
    "tp1-2-4-1": plan([(1, 1, False), (2, 1, False), (4, 1, False), (1, 1, False)]),
    "tp1-4-2-rc": plan([(1, 1, False), (4, 2, False), (2, 1, True)]),
}


def config(p: Plan, schedules=SCHEDULES, backend: str = "gloo", **kw) -> RunConfig:
    return RunConfig(plan=p.to_dict(), model=RunConfig.model_dict(MODEL), steps=STEPS, schedules=list(schedules),
                     backend=backend, chip_map={"A": "cpu", "B": "cpu"}, collect_grads=True, timeout_s=60, **kw)


@functools.lru_cache(maxsize=None)
def run(name: str, schedules: tuple[str, ...] = SCHEDULES) -> dict:
    return launch(config(PLANS[name], schedules))


@functools.lru_cache(maxsize=None)
def reference(sequences: int) -> dict:
    return train_reference(MODEL, STEPS, sequences, collect_grads=True, verbose=False)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def full_grads(results: dict, schedule: str) -> dict[str, torch.Tensor]:
    """Rebuild every full gradient: concatenate TP shards (one per set of ranks sharing a replicated
    key/value slice), sum data-parallel replicas."""
    shards: dict[str, dict[int, dict[int, tuple[torch.Tensor, int | None, int]]]] = {}
    for r in results.values():
        _, d, t = r[schedule]["coord"]
        for name, shard in r[schedule]["grads"].items():
            shards.setdefault(name, {}).setdefault(d, {})[t] = shard
    out = {}
    for name, reps in shards.items():
        total = None
        for tps in reps.values():
            _, dim, replicas = tps[0]
            if replicas > 1:  # every rank of a replica set must hold the same summed gradient
                for t in tps:
                    lead = tps[t - t % replicas][0]
                    assert torch.equal(tps[t][0], lead), f"{name}: TP rank {t} disagrees with its replica set"
            g = tps[0][0] if dim is None else torch.cat([tps[t][0] for t in sorted(tps)[::replicas]], dim)
            total = g if total is None else total + g
        out[name] = total
    return out


def losses(results: dict, schedule: str) -> list[float]:
    (lead,) = [r[schedule]["losses"] for r in results.values()
               if r[schedule]["losses"] is not None and r[schedule]["coord"][1:] == (0, 0)]
    return lead
