"""A plan trained across two emulated clusters (network namespaces, a shaped veth link between them): the
ranks of each chip type run in their own namespace and reach the other cluster only over that link.
Under 1F1B and H-1F1B the losses match the single-process reference; the measured step times are printed
(the bench takes them, the test asserts no speed)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from heteropp.engine import RunConfig
from heteropp.plan import Plan, StagePlan
from tests.heteropp.heteropp_helpers import MODEL, check_losses, reference
from tests.heteropp.netns import Unavailable, two_clusters

STEPS = 2
PLAN = Plan([StagePlan("A", 1, 2), StagePlan("B", 1, 2)], dp=1, micro_batch_size=1, micro_batches=4,
            num_layers=MODEL.layers, schedule="h1f1b", schedule_params={"extra_warmup": [2]})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tx_bytes(c) -> int:
    r = subprocess.run(["ip", "netns", "exec", c.netns, "cat", f"/sys/class/net/{c.ifname}/statistics/tx_bytes"],
                       capture_output=True, text=True, check=True)
    return int(r.stdout)


def run_across(tmp_path, plan: Plan, schedules: list[str], clusters, backend: str = "gloo") -> dict[str, list[dict]]:
    """Each stage's ranks in its chip type's namespace (A -> first cluster, B -> second); returns the lead
    rank's per-step lines per schedule (loss and step time)."""
    a, b, _ = clusters
    log = tmp_path / "loss.jsonl"
    cfg = RunConfig(plan=plan.to_dict(), model=RunConfig.model_dict(MODEL), steps=STEPS, schedules=schedules,
                    backend=backend, chip_map={"A": "cpu", "B": "cpu"}, loss_log=str(log), timeout_s=60)
    path = tmp_path / "run.json"
    path.write_text(json.dumps(cfg.__dict__))
    port, procs = _free_port(), []
    offs = plan.rank_offsets()
    for k, st in enumerate(plan.stages):
        c = a if st.chip == "A" else b
        for r in range(offs[k], offs[k] + plan.stage_ranks(k)):
            env = {**os.environ, "RANK": str(r), "WORLD_SIZE": str(plan.world_size), "MASTER_ADDR": a.address,
                   "MASTER_PORT": str(port), "GLOO_SOCKET_IFNAME": c.ifname, "OMP_NUM_THREADS": "1"}
            procs.append(subprocess.Popen(["ip", "netns", "exec", c.netns, sys.executable, "-m",
                                           "heteropp.engine.worker", "--config", str(path)], env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=240)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(outs)[-3000:]
    steps: dict[str, list[dict]] = {}
    for line in "\n".join(outs).splitlines():
        if line.startswith("[") and "tokens/s" in line:
            label, rest = line[1:].split("]", 1)
            f = rest.split()
            steps.setdefault(label, []).append({"loss": float(f[3]), "tokens_per_s": float(f[4])})
    return steps


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
    steps = run_across(tmp_path, PLAN, ["1f1b", "h1f1b"], clusters, backend)
    activations = 2 * STEPS * PLAN.micro_batches * PLAN.micro_batch_size * MODEL.seq_len * MODEL.hidden * 4
    assert tx_bytes(clusters[0]) - before >= activations
    want = reference(PLAN.global_batch)["losses"]
    for sched in ("1f1b", "h1f1b"):
        check_losses([s["loss"] for s in steps[sched]], want, f"two clusters {sched}")
        tokens = PLAN.global_batch * MODEL.seq_len
        print(f"{sched}: step times {[round(tokens / s['tokens_per_s'], 4) for s in steps[sched]]} s "
              f"(netem delay: {clusters[2]})")
