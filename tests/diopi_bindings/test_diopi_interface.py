"""The C interface: headers generated from the one schema, usable from plain C, and the reference
library exporting exactly the schema's operators."""
from __future__ import annotations

import ctypes
import shutil
import subprocess

import pytest
from diopi_testlib import METADATA_C, compile_c_library

from diopi_bindings import gen_header
from diopi_bindings.abi import ABI_VERSION, INCLUDE_DIR
from diopi_bindings.device_memory import SIGNATURES, STREAM_FUNCTIONS
from diopi_bindings.library import DiopiLibrary
from diopi_bindings.schema import INPUT_KINDS, OPS, OUTPUT_KINDS


def test_committed_header_is_generated_from_the_schema():
    assert gen_header.main(["--check"]) == 0, (
        "functions.h differs from the schema: run python -m diopi_bindings.gen_header")


def test_every_schema_operator_has_a_prototype_with_outputs_first():
    text = (INCLUDE_DIR / "diopi" / "functions.h").read_text()
    for op in OPS:
        assert op.symbol in text
        kinds = [a.kind for a in op.args]
        ranks = [0 if k in OUTPUT_KINDS else 1 if k in INPUT_KINDS else 2 for k in kinds]
        assert ranks == sorted(ranks), f"{op.aten}: outputs, then inputs, then scalars"


def test_headers_compile_as_strict_c99(tmp_path):
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler")
    src = tmp_path / "only_headers.c"
    src.write_text('#include "diopi/functions.h"\nint main(void) { return DIOPI_ABI_VERSION == 0; }\n')
    done = subprocess.run([compiler, "-std=c99", "-Wall", "-Wextra", "-pedantic", "-Werror", "-fsyntax-only",
                           f"-I{INCLUDE_DIR}", str(src)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_reference_library_exports_the_whole_schema(reference_path):
    info = DiopiLibrary(reference_path).info()
    assert info.missing == ()
    assert set(info.implemented) == {op.aten for op in OPS}
    assert info.abi_version == ABI_VERSION and info.vendor == "reference-cpu"
    # and nothing else with the diopi_ prefix: helpers stay hidden
    exported = subprocess.run(["nm", "-D", "--defined-only", str(reference_path)], capture_output=True, text=True)
    if exported.returncode == 0:
        names = {line.split()[-1] for line in exported.stdout.splitlines() if line.split()[-2] in ("T", "W")}
        assert {n for n in names if n.startswith("diopi_")} == {op.symbol for op in OPS} | {
            "diopi_abi_version", "diopi_vendor_name", "diopi_impl_version", "diopi_last_error"} | set(SIGNATURES) | set(
            STREAM_FUNCTIONS)


def test_a_library_may_implement_any_subset(tmp_path):
    # Only the metadata and one operator: the rest are weak declarations that resolve to nothing.
    src = METADATA_C % {"abi": "DIOPI_ABI_VERSION"} + """
diopiError_t diopi_aten_neg(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t self) {
  (void)ctx; (void)out; (void)self; return DIOPI_SUCCESS;
}
"""
    lib = DiopiLibrary(compile_c_library(tmp_path, "subset", src))
    assert lib.info().implemented == ("aten::neg",)
    assert "aten::mm" in lib.info().missing
    with pytest.raises(NotImplementedError, match="aten::mm"):
        lib.call("aten::mm", None, None, None)
    assert isinstance(lib._dll.diopi_aten_neg, ctypes._CFuncPtr)
