"""PyTorch's own distributed suite on dicomm and on gloo, same selection: every test gloo passes,
dicomm passes.

The default run takes a quick selection (collectives this backend once got wrong, any-source
receives, a DDP comm hook chaining futures, the words of a timeout, the group's monitored barrier);
`make test-torch-suite` (DICOMM_TORCH_SUITE=full) runs every test of _DistTestBase.
EXPECTED_FAILURES lists the tests gloo passes that torch itself keeps from any plugin backend, each with
the torch source that decides it.
Each backend runs in its own pytest process (torch's module reads BACKEND when imported); see
dist_suite.py for how dicomm runs gloo's selection of tests.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

pytest.importorskip("expecttest", reason="torch's suite imports expecttest (the test extras)")

SUITE = Path(__file__).with_name("dist_suite.py")
CLASS = "TestDistBackendWithSpawn"
QUICK = ["test_all_gather_coalesced_simple", "test_sparse_all_reduce_sum", "test_send_recv_any_source",
         "test_accumulate_gradients_no_sync_allreduce_with_then_hook", "test_barrier_timeout_full_group",
         "test_monitored_barrier_gloo_rank_0_timeout", "test_get_backend",
         "test_batch_isend_irecv_gloo"]  # dicomm: the backend-coalescing path (one work per batch)
FULL = os.environ.get("DICOMM_TORCH_SUITE") == "full"

# Tests gloo passes that no plugin backend can pass, each with the torch code that decides it. They
# must still fail on dicomm (a listed test that passes is a stale entry and fails the run).
EXPECTED_FAILURES = {
    "test_monitored_barrier_gloo": (
        "dist.monitored_barrier refuses every backend but gloo by name (torch/distributed/distributed_c10d.py, "
        "monitored_barrier: `if get_backend(group) != Backend.GLOO: raise ValueError`); the group's own "
        "pg.monitored_barrier works on dicomm (test_monitored_barrier_gloo_rank_0_timeout here, "
        "tests/dicomm/test_backend_clients.py)"),
    "test_monitored_barrier_gloo_subgroup": "the same refusal by name in dist.monitored_barrier",
    "test_ddp_logging_data_cpu": (
        "asserts DDP's logged backend_name == dist.get_backend(); DDP logs ProcessGroup::getBackendName(), "
        "the group's BackendType, which torch sets to CUSTOM for every plugin backend "
        "(distributed_c10d.py _new_process_group_helper: `backend_type = ProcessGroup.BackendType.CUSTOM`; "
        "ProcessGroup.hpp backendTypeToString -> \"custom\"), while get_backend() says \"dicomm\""),
    "test_get_backend": (
        "asserts dist.get_backend() == the BACKEND variable, which dist_suite.py sets to \"gloo\" so that "
        "gloo's selection and code paths run; dicomm rightly answers \"dicomm\" "
        "(tests/dicomm/test_backend_registration.py checks the name)"),
}


def run_suite(backend: str, tests: list[str] | None, timeout_s: float,
              why: dict[str, str] | None = None) -> dict[str, str]:
    """Outcome per test name ('passed', 'failed', 'skipped') of the suite on `backend`; the text of each
    failure goes to `why` (the junit file it came from is gone once this returns)."""
    with tempfile.TemporaryDirectory() as tmp:
        xml = os.path.join(tmp, "junit.xml")
        temp_dir = os.path.join(tmp, "suite")
        os.mkdir(temp_dir)
        env = dict(os.environ, BACKEND=backend, WORLD_SIZE="2", TEMP_DIR=temp_dir)
        targets = [f"{SUITE}::{CLASS}::{t}" for t in tests] if tests else [str(SUITE)]
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "--timeout=180", f"--junitxml={xml}", *targets], env=env,
                       cwd=Path(__file__).parents[2], capture_output=True, timeout=timeout_s)
        if not os.path.exists(xml):
            raise AssertionError(f"the suite on {backend} reported nothing:\n"
                                 f"{proc.stdout.decode()[-3000:]}{proc.stderr.decode()[-3000:]}")
        outcomes = {}
        for case in ET.parse(xml).iter("testcase"):
            kinds = {child.tag for child in case}
            outcomes[case.get("name")] = ("failed" if kinds & {"failure", "error"} else
                                          "skipped" if "skipped" in kinds else "passed")
            if why is not None and outcomes[case.get("name")] == "failed":
                why[case.get("name")] = "\n".join(
                    (child.get("message") or "") + "\n" + (child.text or "")[-2000:]
                    for child in case if child.tag in ("failure", "error"))
        if not outcomes:
            raise AssertionError(f"the suite on {backend} ran nothing:\n"
                                 f"{proc.stdout.decode()[-3000:]}{proc.stderr.decode()[-3000:]}")
        return outcomes


@pytest.mark.timeout(7200 if FULL else 600)
def test_every_test_gloo_passes_dicomm_passes():
    selection = None if FULL else QUICK
    budget = 6000 if FULL else 270
    gloo = run_suite("gloo", selection, budget)
    why: dict[str, str] = {}
    dicomm = run_suite("dicomm", selection, budget, why)
    passed_on_gloo = sorted(t for t, o in gloo.items() if o == "passed")
    assert passed_on_gloo, f"the gloo reference passed nothing: {gloo}"
    missing = [f"{t}: {dicomm.get(t, 'not run')}" for t in passed_on_gloo
               if dicomm.get(t) != "passed" and t not in EXPECTED_FAILURES]
    assert not missing, "passed on gloo, not on dicomm:\n" + "\n".join(missing) + "".join(
        f"\n--- {t}:\n{text}" for t, text in why.items() if t in passed_on_gloo and t not in EXPECTED_FAILURES)
    stale = [t for t in EXPECTED_FAILURES if dicomm.get(t) == "passed"]
    assert not stale, f"listed as expected failures but pass on dicomm (drop them from the list): {stale}"
    if not FULL:  # the quick selection is chosen to run on both: none may be skipped
        assert sorted(passed_on_gloo) == sorted(QUICK), gloo
        expected_here = [t for t in QUICK if t in EXPECTED_FAILURES]
        assert all(dicomm.get(t) == "failed" for t in expected_here), dicomm
