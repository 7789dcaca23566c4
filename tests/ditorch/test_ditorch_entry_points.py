"""A third-party adapter registered through the ``ditorch.adapters`` entry-point group. The test
builds a real installed-distribution record (``*.dist-info`` with ``entry_points.txt``) in a temporary
directory on ``sys.path``; ``importlib.metadata`` finds it as it finds any installed package. The
adapter's chips are CPU tensors here."""
from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from ditorch_testutil import FIXTURES, run_python

import ditorch
from ditorch.registry import VendorError, select


def install_fake_distribution(root: Path, entry_points: str) -> Path:
    info = root / "ditorch_fake_vendor-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ditorch-fake-vendor\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(entry_points)
    return root


GOOD = "[ditorch.adapters]\nfakechip = ditorch_fake_vendor:ADAPTER\n"
BROKEN = GOOD + "broken = ditorch_fake_vendor:broken_factory\nmissing = no_such_module_xyz:ADAPTER\n"


@pytest.fixture
def fake_vendor(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURES))
    monkeypatch.syspath_prepend(str(install_fake_distribution(tmp_path, GOOD)))
    yield


def test_third_party_adapter_is_discovered(fake_vendor):
    adapter = ditorch.adapter_for("fakechip")
    assert (adapter.device_type, adapter.backend, adapter.package) == ("cpu", "gloo", "ditorch_fake_vendor")
    assert ditorch.adapter_for("FAKE-CHIP-9000") is adapter
    names = [a.name for a in ditorch.all_adapters()]
    assert names.index("mps") < names.index("fakechip") < names.index("cpu")


def test_third_party_adapter_comes_before_cpu_in_automatic_selection(fake_vendor):
    if any(a.is_available() for a in ditorch.all_adapters() if a.priority < ditorch.adapter_for("fakechip").priority):
        pytest.skip("a built-in accelerator is present and comes first")
    adapter, reason = select()
    assert adapter.name == "fakechip" and "mps: " in reason


def test_third_party_adapter_serves_the_unified_device(fake_vendor, plain):
    ditorch.enable("fakechip")
    assert ditorch.device.vendor == "fakechip" and ditorch.device.backend == "gloo"
    x = torch.arange(4.0, device="device")
    with torch._C.DisableTorchFunction():
        want = torch.arange(4.0)
    assert torch.equal(x, want)
    ditorch.device.manual_seed(3)
    assert torch.equal(torch.rand(2, device="device"), torch.rand(2, generator=torch.Generator().manual_seed(3)))


def test_broken_entry_points_are_skipped_and_reported(tmp_path, monkeypatch, caplog, plain):
    monkeypatch.syspath_prepend(str(FIXTURES))
    monkeypatch.syspath_prepend(str(install_fake_distribution(tmp_path, BROKEN)))
    with caplog.at_level(logging.WARNING, logger="ditorch"):
        assert "fakechip" in [a.name for a in ditorch.all_adapters()]
    messages = " | ".join(r.getMessage() for r in caplog.records)
    assert "skipping adapter broken" in messages and "broken on purpose" in messages
    assert "skipping adapter missing" in messages and "no_such_module_xyz" in messages
    with pytest.raises(VendorError, match=r"adapters that failed to load: .*'broken'"):
        ditorch.use_vendor("broken")


def test_entry_point_chosen_by_environment_at_import(tmp_path):
    """A fresh interpreter: DITORCH_VENDOR picks the plug-in when `import ditorch` runs."""
    site = install_fake_distribution(tmp_path, GOOD)
    code = (
        "import logging; logging.basicConfig(level=logging.INFO, format='%(name)s %(message)s')\n"
        "import torch, ditorch\n"
        "x = torch.ones(2, device='device')\n"
        "print('RESULT', ditorch.device.vendor, x.device, float(x.sum()))\n"
    )
    proc = run_python(code, env={"DITORCH_VENDOR": "fakechip", "PYTHONPATH": f"{site}:{FIXTURES}"})
    assert proc.returncode == 0, proc.stderr
    assert "RESULT fakechip cpu 2.0" in proc.stdout
    assert "ditorch vendor fakechip (device type cpu, backend gloo) chosen: DITORCH_VENDOR=fakechip" in proc.stderr
