"""The optional device-memory functions of the ABI: the reference library implements them honestly
(blocks tagged with their device, refusals as error codes), the conformance suite checks them
byte-exactly against the host bytes, and a library with one wrong copy direction fails them."""
from __future__ import annotations

import json

import pytest
import torch
from diopi_testlib import METADATA_C, WRONG_MEMCPY, badcopy_name, compile_c_library

from diopi_bindings.conformance.cli import main
from diopi_bindings.conformance.device_memory import RUNTIME_OP
from diopi_bindings.device_memory import DeviceMemory
from diopi_bindings.library import DiopiLibrary, OperatorError


@pytest.fixture(scope="module")
def memory(reference_path) -> DeviceMemory:
    mem = DeviceMemory.of(DiopiLibrary(reference_path))
    assert mem is not None
    return mem


def test_round_trip_and_cross_device_copy_are_byte_exact(memory):
    assert memory.device_count() == 2
    data = torch.randint(0, 256, (1000,), dtype=torch.uint8)
    a, b = memory.malloc(0, 1000), memory.malloc(1, 1000)
    memory.memcpy_h2d(0, a, data.data_ptr(), 1000)
    memory.memcpy_d2d(1, b, 0, a, 1000)
    back = torch.zeros_like(data)
    memory.memcpy_d2h(1, back.data_ptr(), b, 1000)
    assert torch.equal(back, data)
    memory.free(0, a)
    memory.free(1, b)


def test_refusals_are_error_codes_with_messages(memory):
    host = torch.empty(8, dtype=torch.uint8)
    with pytest.raises(OperatorError, match="did not allocate"):
        memory.free(0, host.data_ptr())
    with pytest.raises(OperatorError, match="out of range: this library has 2"):
        memory.malloc(2, 8)
    ptr = memory.malloc(0, 8)
    with pytest.raises(OperatorError, match="belongs to device 0, not device 1"):
        memory.memcpy_d2h(1, host.data_ptr(), ptr, 8)
    with pytest.raises(OperatorError, match="runs past its allocation"):
        memory.memcpy_d2h(0, host.data_ptr(), ptr, 9)
    memory.free(0, ptr)


@pytest.mark.parametrize("planted", WRONG_MEMCPY)
def test_a_wrong_memcpy_fails_the_suite(reference_variants, tmp_path, planted):
    lib = reference_variants[badcopy_name(planted)]
    report = tmp_path / "r.json"
    assert main(["--impl", str(lib), "--ops", RUNTIME_OP, "aten::neg", "--json", str(report), "-q"]) == 1
    data = json.loads(report.read_text())
    assert data["operators"][RUNTIME_OP]["verdict"] == "fail"
    assert data["operators"]["aten::neg"]["verdict"] == "pass"
    failed = {c["case"] for c in data["cases"] if c["status"] == "fail"}
    assert failed == ({"round trip", "device 0 -> 1", "offset copy"} if planted == "diopi_memcpy_d2h"
                      else {"device 0 -> 1"})


def test_a_library_without_device_memory_is_not_implemented(tmp_path):
    lib = compile_c_library(tmp_path, "nomem", METADATA_C % {"abi": "DIOPI_ABI_VERSION"})
    report = tmp_path / "r.json"
    assert main(["--impl", str(lib), "--ops", RUNTIME_OP, "--json", str(report), "-q"]) == 0
    assert json.loads(report.read_text())["operators"][RUNTIME_OP]["verdict"] == "not implemented"
    assert DeviceMemory.of(DiopiLibrary(lib)) is None
