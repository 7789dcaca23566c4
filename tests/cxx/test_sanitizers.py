"""The engine under AddressSanitizer + UndefinedBehaviorSanitizer: a build of dicomm._C of its own
(build/asan) runs a CI-sized selection of the engine tests (point-to-point on every transport,
collectives, errors, failures), with Python loading the ASan runtime first (LD_PRELOAD) and
leak detection off (the interpreter keeps its objects alive at exit by design). Any report, in
any rank, fails the test; it is written to a file per process and shown here. The progress and
matching tests run the same way under ThreadSanitizer (build/tsan), and the precision module
(ditorch_precision._C, the C++ op hook of a capture) under ASan + UBSan, with its tests.
"""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass

import pytest

from tests.cxx import cxx_build

# The selection: every engine path (p2p on shm, tcp and the shm pipeline; collectives; error,
# failure and liveness handling) in about a minute and a half of a 2-core machine.
ENGINE_TESTS = [
    "tests/dicomm/test_engine_p2p.py",
    "tests/dicomm/test_engine_errors.py",
    "tests/dicomm/test_engine_failure.py",
    "tests/dicomm/test_collectives_allreduce.py",
    "tests/dicomm/test_collectives_work_stealing.py",  # claim words shared between processes
    "tests/dicomm/test_collectives_rooted.py",
    "tests/dicomm/test_collectives_errors.py",
    # held connections and the card reader's hand-over (the rest of that file is in THREADED_TESTS)
    "tests/dicomm/test_engine_card_auth.py::test_a_connection_before_the_card_is_read_delivers_nothing",
]
SANITIZED_SITE = os.path.join(os.path.dirname(__file__), "sanitized")


@dataclass(frozen=True)
class Module:
    """An extension module a sanitizer build replaces (see sanitized/sitecustomize.py)."""

    name: str  # its import name
    target: str  # its CMake target
    folder: str  # where the build puts it, under the build folder
    variable: str  # the variable naming the sanitized file to sitecustomize


ENGINE = Module("dicomm._C", "_C", "", "DICOMM_SANITIZED_MODULE")
PRECISION = Module("ditorch_precision._C", "_C_precision", "ditorch_precision", "PRECISION_SANITIZED_MODULE")


def _env(target: Module, module: str, preload: str, reports: str, options_var: str, options: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        target.variable: module,
        "PYTHONPATH": os.pathsep.join([SANITIZED_SITE, str(cxx_build.REPO), env.get("PYTHONPATH", "")]),
        "LD_PRELOAD": preload,
        options_var: f"{options}:log_path={reports}/report",
        "UBSAN_OPTIONS": f"print_stacktrace=1:halt_on_error=1:log_path={reports}/ubsan",
        "DICOMM_REQUIRE_CXX_CHECKS": "",  # the nested run checks the engine, not the tools
    })
    return env


def _reports(folder) -> str:
    return "\n".join(p.read_text(errors="replace")[-4000:] for p in sorted(folder.iterdir()))


def _loads_sanitized(env: dict[str, str], target: Module, module: str, runtime: str) -> None:
    """The control: in this environment Python imports the sanitizer build with its runtime mapped,
    so a clean run below means a clean module, not an unsanitized one."""
    probe = (f"import {target.name} as C\n"
             "maps = open('/proc/self/maps').read()\n"
             f"print(C.__file__ == {module!r}, {runtime!r} in maps)\n")
    p = subprocess.run([sys.executable, "-c", probe], env=env, cwd=cxx_build.REPO, capture_output=True,
                       text=True, timeout=120)
    assert p.stdout.split() == ["True", "True"], f"the sanitizer build did not load:\n{p.stdout}{p.stderr[-3000:]}"


def _run_sanitized(tmp_path, sanitize: str, runtime_name: str, options_var: str, options: str,
                   tests: list[str], target: Module = ENGINE) -> None:
    """Builds `target` with `sanitize` in build/<runtime>, runs `tests` on it, fails on any report."""
    runtime = cxx_build.runtime_library(runtime_name)
    # libstdc++ too, loaded before any module: the sanitizer finds the C++ runtime's functions it
    # wraps (__cxa_throw) when it starts, and Python itself does not link libstdc++.
    preload = f"{runtime} {cxx_build.runtime_library('libstdc++.so')}"
    name = runtime_name.removeprefix("lib").removesuffix(".so")
    build = cxx_build.configure(name, f"DICOMM_SANITIZE={sanitize}", targets=(target.target,))
    module = str(cxx_build.module_file(build / target.folder))
    reports = tmp_path / "reports"
    reports.mkdir()
    env = _env(target, module, preload, str(reports), options_var, options)
    _loads_sanitized(env, target, module, os.path.basename(runtime))
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests],
                       env=env, cwd=cxx_build.REPO, capture_output=True, text=True, timeout=1200)
    found = _reports(reports)
    assert p.returncode == 0 and not found, (
        f"{tests} with {sanitize}: exit {p.returncode}\n{found}\n{p.stdout[-6000:]}{p.stderr[-3000:]}")


ASAN_OPTIONS = "detect_leaks=0:abort_on_error=0:halt_on_error=1:detect_stack_use_after_return=0"


@pytest.mark.timeout(1500)
def test_engine_tests_pass_under_asan_and_ubsan(tmp_path):
    _run_sanitized(tmp_path, "address;undefined", "libasan.so", "ASAN_OPTIONS", ASAN_OPTIONS, ENGINE_TESTS)


# The precision module's tests that run it: the C++ op hook (stats and full captures, the index
# writer and its thread, uninitialised memory through views, DDP and tensor-parallel gloo jobs with
# c10d and functional collectives, point-to-point transfers, a fork inside a capture, an op it cannot
# describe, the ops it numbers and the ones it does not). About three minutes of a 2-core machine,
# and the module's build.
PRECISION_TESTS = [
    "tests/precision/test_precision_native.py",
    "tests/precision/test_precision_native_full.py",
    "tests/precision/test_precision_index_writer.py",
    "tests/precision/test_precision_unwritten.py",
    "tests/precision/test_precision_capture_fork.py",
    "tests/precision/test_precision_capture_undescribed_op.py",
    "tests/precision/test_precision_functional_collectives.py",
    "tests/precision/test_precision_hook_sequences.py",
    "tests/precision/test_precision_transfer_hooks.py",
]


@pytest.mark.timeout(1500)
def test_precision_cpp_hook_tests_pass_under_asan_and_ubsan(tmp_path):
    _run_sanitized(tmp_path, "address;undefined", "libasan.so", "ASAN_OPTIONS", ASAN_OPTIONS, PRECISION_TESTS,
                   target=PRECISION)


# Progress (the progress thread taking over from callers, liveness) and matching (ordering, wildcard
# receives, both directions at once): the engine's cross-thread paths.
THREADED_TESTS = [
    "tests/dicomm/test_engine_p2p.py",
    "tests/dicomm/test_engine_liveness.py",
    "tests/dicomm/test_engine_card_auth.py",  # the card reader thread and held connections
]


@pytest.mark.timeout(1500)
def test_progress_and_matching_tests_pass_under_tsan(tmp_path):
    _run_sanitized(tmp_path, "thread", "libtsan.so", "TSAN_OPTIONS", "halt_on_error=1:second_deadlock_stack=1",
                   THREADED_TESTS)
