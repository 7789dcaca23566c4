"""A pipeline with a stage on a vendor's own torch device: the DIOPI device (an operator library through the
DIOPI ABI, `ditorch/adapters/diopi.py`, here the CPU reference library), which torch knows only once the
vendor is enabled, and whose tensors are of another kind than the CPU's. One stage on the CPU, one on the
DIOPI device, gloo or dicomm between them (activations staged through host memory: neither serves that
device's tensors), against the single-process CPU reference. Each run is its own `python` process, as
`heteropp run` is: the launcher's fork server takes the environment that chooses the vendor from the process
that starts it.

Before: `import ditorch` at the import of the worker module enabled the vendor inside the fork server, and
every forked worker then refused to run autograd ("Unable to handle autograd's threading in combination with
fork-based multiprocessing"); moving a stage to the device dropped its parameters' attributes (`shard_dim`:
Module.to makes new Parameters for such tensors); a host without the vendor failed on
`torch.device('diopi')` without saying which stage or why; and dicomm between the stages was handed the
device's tensors ("No backend type associated with device type diopi").
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RTOL = 1e-5  # the reference library's float32 kernels, each against torch's CPU ones

RUN = """
import json, sys
from heteropp.engine import RunConfig, launch
from heteropp.plan import Plan, StagePlan
from tests.heteropp.heteropp_helpers import MODEL, STEPS, full_grads, losses, ref_grads, reference, rel
plan = Plan([StagePlan("host", 1, 2), StagePlan("lib", 1, 2)], dp=1, micro_batch_size=1, micro_batches=4,
            num_layers=MODEL.layers)
cfg = RunConfig(plan=plan.to_dict(), model=RunConfig.model_dict(MODEL), steps=STEPS, schedules=["1f1b"],
                backend=sys.argv[1], chip_map={"host": "cpu", "lib": "diopi"}, collect_grads=True, timeout_s=120)
res = launch(cfg)
want = reference(plan.global_batch)
got = full_grads(res, "1f1b")
print("RESULT " + json.dumps({
    "devices": {str(r["1f1b"]["coord"][0]): r["1f1b"]["device"] for r in res.values()},
    "losses": losses(res, "1f1b"), "reference": want["losses"],
    "names": sorted(got) == sorted(ref_grads(want)),
    "worst": max(rel(got[n], g) for n, g in ref_grads(want).items())}))
"""


def _run(env: dict[str, str], backend: str = "gloo") -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("DITORCH_VENDOR", "DIOPI_LIBRARY")}
    return subprocess.run([sys.executable, "-c", RUN, backend], cwd=REPO, env={**base, "OMP_NUM_THREADS": "1", **env},
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("backend", ["gloo", "dicomm"])
def test_a_stage_on_the_diopi_device_trains_as_the_cpu_reference(backend: str) -> None:
    done = _run({"DITORCH_VENDOR": "diopi"}, backend)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    got = json.loads(line.removeprefix("RESULT "))
    assert got["devices"] == {"0": "cpu", "1": "diopi"}, got  # the stage really ran on the vendor's device
    assert len(got["losses"]) == len(got["reference"]) == 2
    for step, (a, b) in enumerate(zip(got["losses"], got["reference"]), 1):
        assert abs(a - b) / abs(b) < RTOL, f"step {step}: loss {a} vs reference {b}"
    assert got["names"] and got["worst"] < RTOL, got


def test_a_host_without_the_stages_vendor_is_told_which_stage_and_why() -> None:
    done = _run({})  # no DIOPI library and the vendor not asked for: this host has only the CPU
    assert done.returncode != 0
    text = done.stdout + done.stderr
    assert "stage 1 (chip type 'lib') runs on vendor 'diopi', which is not usable on this host" in text, text[-3000:]
    assert "DIOPI_LIBRARY is not set" in text, text[-3000:]


def test_the_fork_servers_modules_enable_no_vendor() -> None:
    """What the launcher's fork server imports must leave every device off (as CUDA must stay uninitialised
    before a fork): each forked worker enables its own."""
    code = ("import sys, heteropp.engine.launch, heteropp.engine.worker; "
            "d = sys.modules.get('diopi_bindings.device'); print(bool(d and d.is_enabled()))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "DITORCH_VENDOR": "diopi"})
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stdout + done.stderr
