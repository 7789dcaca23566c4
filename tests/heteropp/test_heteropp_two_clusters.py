"""A plan trained across two emulated clusters (network namespaces, a shaped veth link between them): the
ranks of each chip type run in their own namespace and reach the other cluster only over that link.
Under 1F1B and H-1F1B the losses match the single-process reference; the measured step times are printed
(the bench takes them, the test asserts no speed)."""
from __future__ import annotations

import pytest

from bench.heteropp_netns import Unavailable, run_across, two_clusters, tx_bytes
from heteropp.engine import RunConfig
from heteropp.plan import Plan, StagePlan
from tests.heteropp.heteropp_helpers import MODEL, check_losses, reference

STEPS = 2
PLAN = Plan([StagePlan("A", 1, 2), StagePlan("B", 1, 2)], dp=1, micro_batch_size=1, micro_batches=4,
            num_layers=MODEL.layers, schedule="h1f1b", schedule_params={"extra_warmup": [2]})


@pytest.fixture(scope="module")
def clusters():
    try:
        with two_clusters() as c:
            yield c
    except Unavailable as e:
        pytest.skip(f"emulated clusters unavailable: {e}")


@pytest.mark.parametrize("backend", ["gloo", "dicomm"])
def test_two_clusters_train_to_the_reference_under_1f1b_and_h1f1b(tmp_path, clusters, backend):
    """Also: every activation crossed the shaped link (A's end sent at least all of them)."""
    before = tx_bytes(clusters[0])
    cfg = RunConfig(plan=PLAN.to_dict(), model=RunConfig.model_dict(MODEL), steps=STEPS, schedules=["1f1b", "h1f1b"],
                    backend=backend, chip_map={"A": "cpu", "B": "cpu"}, timeout_s=60)
    steps = run_across(tmp_path, cfg, clusters)
    activations = 2 * STEPS * PLAN.micro_batches * PLAN.micro_batch_size * MODEL.seq_len * MODEL.hidden * 4
    assert tx_bytes(clusters[0]) - before >= activations
    want = reference(PLAN.global_batch)["losses"]
    for sched in ("1f1b", "h1f1b"):
        check_losses([s["loss"] for s in steps[sched]], want, f"two clusters {sched}")
        tokens = PLAN.global_batch * MODEL.seq_len
        print(f"{sched}: step times {[round(tokens / s['tokens_per_s'], 4) for s in steps[sched]]} s "
              f"(netem delay: {clusters[2]})")
