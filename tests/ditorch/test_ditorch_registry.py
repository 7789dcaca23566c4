"""Vendor adapters and selection. Runs on a CPU-only machine: every accelerator adapter must report
itself unavailable with a reason, and the CPU adapter is chosen last."""
from __future__ import annotations

import logging

import pytest
import torch

import ditorch
from ditorch.adapters import cuda as cuda_adapter
from ditorch.registry import VendorError, builtin_adapters, select

# Written from the vendors' documentation, not from ditorch: (torch device type, collective backend).
EXPECTED = {
    "cuda": ("cuda", "nccl"),
    "rocm": ("cuda", "nccl"),
    "npu": ("npu", "hccl"),
    "mlu": ("mlu", "cncl"),
    "musa": ("musa", "mccl"),
    "xpu": ("xpu", "xccl"),
    "mps": ("mps", "gloo"),
    "diopi": ("diopi", "gloo"),  # an operator library behind a generic device; collectives over host memory
    "cpu": ("cpu", "gloo"),
}
ALIASES = {"dipu": "diopi", "nvidia": "cuda", "ascend": "npu", "Cambricon": "mlu", "mthreads": "musa", "intel": "xpu",
           "amd": "rocm"}


def test_builtin_adapters_declare_device_type_and_backend():
    adapters = {a.name: a for a in builtin_adapters()}
    assert {name: (a.device_type, a.backend) for name, a in adapters.items()} == EXPECTED
    for adapter in adapters.values():
        assert adapter.autocast_device_type == adapter.device_type


@pytest.mark.parametrize("name", sorted(EXPECTED) + sorted(ALIASES))
def test_adapter_for_chip_names(name):
    """What the pipeline planner asks about chips that need not be present on this machine."""
    adapter = ditorch.adapter_for(name)
    assert (adapter.device_type, adapter.backend) == EXPECTED[ALIASES.get(name, name)]


def test_adapter_for_unknown_name_lists_the_known_ones():
    with pytest.raises(VendorError, match=r"unknown vendor or chip type 'tpu'.*npu \(ascend/huawei\).*cpu"):
        ditorch.adapter_for("tpu")


def test_selection_order_puts_cpu_last():
    names = [a.name for a in ditorch.all_adapters()]
    assert names[-1] == "cpu"
    assert names.index("cuda") < names.index("npu") < names.index("mlu") < names.index("musa") < names.index("cpu")


def test_cuda_adapter_detection_agrees_with_torch():
    reason = cuda_adapter.ADAPTER.unavailable_reason()
    assert (reason is None) == (torch.version.cuda is not None and torch.cuda.is_available())
    if torch.version.cuda is None:
        assert reason == "this torch build has no CUDA support"


@pytest.mark.skipif(torch.cuda.is_available() or torch.backends.mps.is_available(), reason="machine has an accelerator")
def test_automatic_selection_on_a_cpu_only_machine():
    adapter, reason = select()
    assert adapter.name == "cpu"
    assert reason.startswith("first available in order cuda, rocm, npu")
    assert "npu: torch_npu is not installed" in reason


def test_one_log_line_names_the_vendor_and_why(plain, caplog, monkeypatch):
    monkeypatch.setenv("DITORCH_VENDOR", "host")
    with caplog.at_level(logging.INFO, logger="ditorch"):
        ditorch.use_vendor()
    records = [r for r in caplog.records if r.name == "ditorch"]
    assert len(records) == 1 and records[0].levelno == logging.INFO
    assert records[0].getMessage() == "vendor cpu (device type cpu, backend gloo) chosen: DITORCH_VENDOR=host"


def test_unknown_vendor_is_a_clear_error(plain):
    with pytest.raises(VendorError) as err:
        ditorch.use_vendor("tpu-v9")
    message = str(err.value)
    assert "DITORCH_VENDOR='tpu-v9' names no known vendor" in message
    assert "known vendors: cuda, rocm, npu, mlu, musa, xpu, mps, diopi, cpu" in message
    assert "cpu" in message.split("available here: ")[1].split(".")[0].split(", ")


@pytest.mark.skipif(ditorch.adapter_for("npu").is_available(), reason="an Ascend NPU is present")
def test_unavailable_vendor_is_a_clear_error(plain):
    with pytest.raises(VendorError, match=r"'ascend' \(Huawei Ascend NPU\) is not available here: "
                       r"torch_npu is not installed; available here: .*cpu"):
        ditorch.use_vendor("ascend")


def test_a_failed_selection_keeps_the_previous_vendor(shim):
    before = ditorch.current_adapter()
    with pytest.raises(VendorError):
        ditorch.enable("nonexistent")
    assert ditorch.current_adapter() is before and ditorch.is_enabled()
