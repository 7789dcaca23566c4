"""Builds of the engine in build directories of their own (sanitizers, the compile database that
clang-tidy reads), and the rule for a missing tool: skip with the reason, except in CI
(DICOMM_REQUIRE_CXX_CHECKS=1, set by .ci/run), where a check that cannot run fails."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def missing(what: str) -> None:
    """Skips (or fails, in CI) because `what` is not available here."""
    if os.environ.get("DICOMM_REQUIRE_CXX_CHECKS") == "1":
        pytest.fail(f"{what}; CI must run every C++ check (DICOMM_REQUIRE_CXX_CHECKS=1)")
    pytest.skip(what)


def _run(cmd: list[str], what: str, timeout: int) -> None:
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        pytest.fail(f"{what} failed (exit {p.returncode}):\n{(p.stdout + p.stderr)[-6000:]}")


def configure(name: str, *defines: str, targets: tuple[str, ...] = (), timeout: int = 900) -> Path:
    """Configures (and builds `targets` of) the project in build/<name> with -Werror and the given
    -D definitions; incremental when the folder is already there. Returns the build folder."""
    if shutil.which("cmake") is None:
        missing("cmake is not installed")
    try:
        import pybind11
    except ImportError:
        missing("pybind11 is not installed in this environment")
    out = REPO / "build" / name
    gen = ["-G", "Ninja"] if shutil.which("ninja") and not (out / "Makefile").exists() else []
    _run(["cmake", "-S", str(REPO), "-B", str(out), *gen, "-DCMAKE_BUILD_TYPE=Release", "-DCMAKE_CXX_FLAGS=-g1",
          "-DDICOMM_WERROR=ON", "-DCMAKE_EXPORT_COMPILE_COMMANDS=ON", f"-DPython_EXECUTABLE={sys.executable}",
          f"-Dpybind11_DIR={pybind11.get_cmake_dir()}", *(f"-D{d}" for d in defines)],
         f"cmake configure of build/{name}", timeout)
    if targets:
        jobs = str(max(1, min(os.cpu_count() or 1, 4)))
        _run(["cmake", "--build", str(out), "-j", jobs, "--target", *targets], f"build of build/{name}", timeout)
    return out


def module_file(build: Path) -> Path:
    """The _C extension module a build folder holds (dicomm's; ditorch_precision's in its own
    folder of the build)."""
    found = sorted(build.glob("_C.*.so"))
    if not found:
        pytest.fail(f"{build} holds no _C module after the build")
    return found[0]


def runtime_library(name: str) -> str:
    """The compiler's copy of a sanitizer runtime (libasan.so, libtsan.so), or skips."""
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        missing(f"no C++ compiler ({cxx})")
    path = subprocess.run([cxx, f"-print-file-name={name}"], capture_output=True, text=True).stdout.strip()
    if not os.path.isabs(path) or not os.path.exists(path):
        missing(f"{cxx} has no {name} (its sanitizer runtime is not installed)")
    return path
