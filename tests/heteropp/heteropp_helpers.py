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


def config(p: Plan, schedules=SCHEDULES, backend: str = "gloo", steps: int = STEPS, **kw) -> RunConfig:
    return RunConfig(plan=p.to_dict(), model=RunConfig.model_dict(MODEL), steps=steps, schedules=list(schedules),
                     backend=backend, chip_map={"A": "cpu", "B": "cpu"}, collect_grads=True, timeout_s=60, **kw)


@functools.lru_cache(maxsize=None)
def run(name: str, schedules: tuple[str, ...] = SCHEDULES) -> dict:
    return launch(config(PLANS[name], schedules))


@functools.lru_cache(maxsize=None)
def reference(sequences: int) -> dict:
    return train_reference(MODEL, STEPS, sequences, collect_grads=True, verbose=False)


def ref_grads(want: dict, step: int = 1) -> dict[str, torch.Tensor]:
    """The reference's gradients of `step` (1-based)."""
    return want["grads"][step - 1]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


ATOL = 1e-9  # floor under the relative tolerance, for tensors whose norm is (near) zero

Shard = tuple[torch.Tensor, int | None, int]  # (tensor, TP shard dimension or None, TP ranks sharing it)


def _by_replica(results: dict, schedule: str, key: str, step: int | None) -> dict[str, dict[int, dict[int, Shard]]]:
    """name -> DP replica -> TP rank -> that rank's shard of `key` ("grads" at `step`, or "params")."""
    out: dict[str, dict[int, dict[int, Shard]]] = {}
    for r in results.values():
        _, d, t = r[schedule]["coord"]
        got = r[schedule][key] if step is None else r[schedule][key][step - 1]
        for name, shard in got.items():
            out.setdefault(name, {}).setdefault(d, {})[t] = shard
    return out


def _join(name: str, tps: dict[int, Shard]) -> torch.Tensor:
    """One replica's full tensor from its TP ranks' shards: the ranks of a set sharing a slice (key/value
    heads, or all of them for an unsharded tensor) must hold the same values; the sets' slices concatenate."""
    _, dim, replicas = tps[0]
    if dim is None:
        replicas = len(tps)
    for t in tps:
        lead = tps[t - t % replicas][0]
        assert torch.equal(tps[t][0], lead), f"{name}: TP rank {t} disagrees with its replica set"
    return tps[0][0] if dim is None else torch.cat([tps[t][0] for t in sorted(tps)[::replicas]], dim)


def full_grads(results: dict, schedule: str, step: int = 1) -> dict[str, torch.Tensor]:
    """Every full gradient of `step` (1-based), as the reference computes it: TP shards joined, data-parallel
    replicas' partial gradients summed."""
    return {name: sum(_join(name, tps) for tps in reps.values())
            for name, reps in _by_replica(results, schedule, "grads", step).items()}


def full_params(results: dict, schedule: str) -> dict[str, torch.Tensor]:
    """Every full parameter after the last step. ZeRO-1 all-gathers the updated shards, so every DP
    replica must hold exactly the same full parameters: each rank's shard is checked, not just one."""
    out = {}
    for name, reps in _by_replica(results, schedule, "params", None).items():
        full = {d: _join(name, tps) for d, tps in reps.items()}
        for d, w in full.items():
            assert torch.equal(w, full[0]), f"{name}: DP replica {d} holds other parameters than replica 0"
        out[name] = full[0]
    return out


def mismatches(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], rtol: float = RTOL,
               atol: float = ATOL) -> list[str]:
    """Names whose tensors differ by more than rtol of the reference's norm plus atol (empty: all match)."""
    assert set(got) == set(want), f"parameters differ: {set(got) ^ set(want)}"
    bad = []
    for n in sorted(want):
        err = (got[n].double() - want[n].double()).norm().item()
        if not err <= rtol * want[n].double().norm().item() + atol:
            bad.append(f"{n} (relative {rel(got[n], want[n]):.2e})")
    return bad


def check_losses(got: list[float], want: list[float], label: str, rtol: float = RTOL) -> None:
    """Every step's loss within rtol of the reference's, and as many steps (zip alone would pass on none)."""
    assert len(got) == len(want), f"{label}: {len(got)} losses, the reference has {len(want)}"
    for step, (a, b) in enumerate(zip(got, want), 1):
        assert abs(a - b) / abs(b) < rtol, f"{label} step {step}: loss {a} vs reference {b}"


def losses(results: dict, schedule: str) -> list[float]:
    (lead,) = [r[schedule]["losses"] for r in results.values()
               if r[schedule]["losses"] is not None and r[schedule]["coord"][1:] == (0, 0)]
    return lead


def holder_params(results: dict, schedule: str, tied: bool = False) -> dict[str, torch.Tensor]:
    """Every parameter after the last step of a run of any plan (replica groups too): each holder's TP shards
    joined (per group, stage and replica), every holder's full tensor checked equal to the first's. `tied`:
    the output head is the embedding, so a stage's copy of it (head.weight) must equal every embedding."""
    shards: dict[tuple[int, int, int, str], dict[int, Shard]] = {}
    for r in results.values():
        k, d, t = r[schedule]["coord"]
        for name, shard in r[schedule]["params"].items():
            name = "embed.weight" if tied and name == "head.weight" else name
            shards.setdefault((r[schedule]["group"], k, d, name), {})[t] = shard
    out: dict[str, torch.Tensor] = {}
    for (group, k, d, name), tps in sorted(shards.items(), key=lambda kv: str(kv[0])):
        _, dim, replicas = tps[0]
        full = tps[0][0] if dim is None else torch.cat([tps[t][0] for t in sorted(tps)[::replicas]], dim)
        if name in out:
            assert torch.equal(full, out[name]), f"{name}: group {group} stage {k} replica {d} differs"
        out[name] = full
    return out
