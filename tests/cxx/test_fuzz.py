"""Every wire parser survives a few seconds of fuzzing under ASan + UBSan (tests/cxx/fuzz_build.py;
`make fuzz` runs them longer, DICOMM_FUZZ_SECONDS sets this test's time per target)."""
from __future__ import annotations

import os

import pytest

from tests.cxx import cxx_build, fuzz_build

SECONDS = float(os.environ.get("DICOMM_FUZZ_SECONDS", "4"))


@pytest.fixture(scope="module")
def asan_build():
    cxx_build.runtime_library("libasan.so")  # skips (fails in CI) without the sanitizer runtime
    return cxx_build.configure("asan", "DICOMM_SANITIZE=address;undefined", targets=("dicomm_engine",))


@pytest.mark.timeout(900)
@pytest.mark.parametrize("target", fuzz_build.TARGETS)
def test_wire_parser_survives_fuzzing(asan_build, target):
    exe = fuzz_build.link(target, asan_build, asan_build.parent / "fuzz")
    done = fuzz_build.run(exe, SECONDS)
    assert done.returncode == 0, f"{target} found a problem:\n{done.stderr[-8000:]}"
