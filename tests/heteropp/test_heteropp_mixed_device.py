"""A pipeline whose stages live on different devices: one stage on CUDA, the others on the CPU, dicomm
between them (CUDA activations and gradients cross through its CPU-mediated path), against the
single-process CPU reference. Runs only where CUDA is present (the device machine); skips elsewhere.

One GPU serves every CUDA rank, so CUDA stages have TP 1 and DP 1 (NCCL refuses two ranks on one GPU).
The tolerance is wider than the all-CPU tests' 1e-5: CUDA's fp32 kernels sum in other orders than the
CPU's (TF32 stays off, torch's default for matmul), so a few ulps per reduction add up over a step.
"""
from __future__ import annotations

import functools

import pytest
import torch

from heteropp.engine import RunConfig, launch
from heteropp.plan import Plan, StagePlan
from tests.heteropp.heteropp_helpers import MODEL, SCHEDULES, STEPS, full_grads, losses, ref_grads, reference, rel

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

RTOL_MIXED = 1e-4

PLANS = {
    # CUDA first: the embedding and the first layers on the GPU, TP 2 on the CPU after it.
    "cuda-cpu_tp2": Plan([StagePlan("gpu", 1, 2, False), StagePlan("host", 2, 2, False)], dp=1,
                         micro_batch_size=1, micro_batches=4, num_layers=MODEL.layers),
    # CUDA last, with recompute: the head and the loss on the GPU.
    "cpu_tp2-cuda_rc": Plan([StagePlan("host", 2, 1, False), StagePlan("gpu", 1, 3, True)], dp=1,
                            micro_batch_size=1, micro_batches=4, num_layers=MODEL.layers),
    # CUDA in the middle: activations cross CPU -> CUDA -> CPU.
    "cpu-cuda-cpu": Plan([StagePlan("host", 1, 1, False), StagePlan("gpu", 1, 2, False),
                          StagePlan("host", 1, 1, False)], dp=1, micro_batch_size=1, micro_batches=4,
                         num_layers=MODEL.layers),
}


@functools.lru_cache(maxsize=None)
def run(name: str) -> dict:
    cfg = RunConfig(plan=PLANS[name].to_dict(), model=RunConfig.model_dict(MODEL), steps=STEPS,
                    schedules=list(SCHEDULES), backend="dicomm", chip_map={"gpu": "cuda", "host": "cpu"},
                    collect_grads=True, timeout_s=120)
    return launch(cfg)


CASES = [(name, s) for name in PLANS for s in SCHEDULES]


@pytest.mark.parametrize("name,schedule", CASES)
def test_mixed_device_losses_match_cpu_reference(name: str, schedule: str) -> None:
    got, want = losses(run(name), schedule), reference(PLANS[name].global_batch)["losses"]
    assert len(got) == len(want) == STEPS
    for step, (a, b) in enumerate(zip(got, want), 1):
        assert abs(a - b) / abs(b) < RTOL_MIXED, f"{name} {schedule} step {step}: loss {a} vs reference {b}"


@pytest.mark.parametrize("name,schedule", CASES)
def test_mixed_device_gradients_match_cpu_reference(name: str, schedule: str) -> None:
    got, want = full_grads(run(name), schedule), ref_grads(reference(PLANS[name].global_batch))
    assert set(got) == set(want), f"parameters differ: {set(got) ^ set(want)}"
    worst = max((rel(got[n], want[n]), n) for n in want)
    print(f"{name} {schedule}: worst gradient relative error {worst[0]:.2e} ({worst[1]})")
    assert worst[0] < RTOL_MIXED, f"{name} {schedule}: gradient of {worst[1]} off by {worst[0]:.2e}"


def test_cuda_stage_really_ran_on_cuda() -> None:
    """Guards against a chip map silently falling back to the CPU: the GPU stage's result says cuda."""
    res = run("cpu-cuda-cpu")
    devices = {r["1f1b"]["coord"][0]: r["1f1b"]["device"] for r in res.values()}
    assert devices == {0: "cpu", 1: "cuda", 2: "cpu"}, devices
