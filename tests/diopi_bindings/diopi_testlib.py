"""Helpers and fixtures of the DIOPI tests (conftest.py registers the fixtures). Libraries they load:
the reference build of the package, test variants of it built here in one cmake build (operators left
out, kernels planted wrong), and tiny malformed C libraries."""
from __future__ import annotations

import atexit
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest

from diopi_bindings.abi import INCLUDE_DIR
from diopi_bindings.build import ReferenceVariant, build_reference_variants
from diopi_bindings.library import reference_library_path
from tests.machine_lock import machine_lock

REPO_ROOT = Path(__file__).resolve().parents[2]

# The variant: two operators not exported, two computed wrong; everything else exact.
OMITTED = ("aten::gelu", "aten::gelu_backward")
PLANTED_WRONG = "aten::mm"  # its kernel writes from inside a lambda, through WRITE
PLANTED_WRONG_ALLOCATING = "aten::nonzero"  # its output is allocated through the context; indices off by one


def symbol(op: str) -> str:
    from diopi_bindings.schema import BY_NAME

    return BY_NAME[op].symbol


@pytest.fixture(scope="session")
def reference_path() -> Path:
    return reference_library_path()


@pytest.fixture(scope="session")
def variant_path(reference_variants) -> Path:
    return reference_variants["diopi_variant"]


def compile_c_library(directory: Path, name: str, source: str) -> Path:
    """A shared library from C source, against the DIOPI headers."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler")
    src = directory / f"{name}.c"
    src.write_text(source)
    out = directory / f"lib{name}.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", f"-I{INCLUDE_DIR}", str(src), "-o", str(out)], check=True)
    return out


METADATA_C = """
#include "diopi/functions.h"
uint32_t diopi_abi_version(void) { return %(abi)s; }
const char* diopi_vendor_name(void) { return "test"; }
const char* diopi_impl_version(void) { return "9.9"; }
const char* diopi_last_error(void) { return ""; }
"""

# A library that lacks operators a training step uses: they must fall back to the CPU.
PARTIAL_OMITTED = ("aten::mm", "aten::bmm", "aten::silu", "aten::embedding", "aten::_softmax_backward_data")


# Device-memory copies a test library gets wrong, one library each: the conformance suite must fail them.
WRONG_MEMCPY = ("diopi_memcpy_d2h", "diopi_memcpy_d2d")


def badcopy_name(planted: str) -> str:
    return f"diopi_badcopy_{planted.removeprefix('diopi_memcpy_')}"


def variants_to_build() -> tuple[ReferenceVariant, ...]:
    """Every library the DIOPI tests build: one cmake build compiles the reference's sources once for all."""
    return (ReferenceVariant("diopi_variant", omit=tuple(symbol(op) for op in OMITTED),
                             plant_wrong=(symbol(PLANTED_WRONG), symbol(PLANTED_WRONG_ALLOCATING))),
            ReferenceVariant("diopi_partial", omit=tuple(symbol(op) for op in PARTIAL_OMITTED)),
            *(ReferenceVariant(badcopy_name(planted), plant_wrong=(planted,)) for planted in WRONG_MEMCPY))


@pytest.fixture(scope="session")
def reference_variants(tmp_path_factory) -> dict[str, Path]:
    """The libraries of variants_to_build(), by name (built once per session, whichever test asks first)."""
    if shutil.which("cmake") is None:
        pytest.skip("cmake is not installed")
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):  # the run's directory, shared by its workers: one build for all
        root = root.parent
    with machine_lock("diopi-variants"):  # the second worker's cmake finds the build up to date
        return build_reference_variants(root / "diopi-variants", variants_to_build())


@pytest.fixture(scope="session")
def partial_path(reference_variants) -> Path:
    return reference_variants["diopi_partial"]


# Operators on device tensors da, db against plain CPU torch on a, b (indented for run_python's code).
OPERATOR_CHECKS = """\
        checks = {
            "broadcast add": ((da + 2 * db).cpu(), a + 2 * b),
            "transposed silu": (torch.nn.functional.silu(da.t()).cpu(), torch.nn.functional.silu(a.t())),
            "softmax": (torch.softmax(da, -1).cpu(), torch.softmax(a, -1)),
            "matmul": ((da @ da.t()).cpu(), a @ a.t()),
            "mean": (da.mean(0).cpu(), a.mean(0)),
        }"""


class SnippetServer:
    """The client of snippet_server.py, started on first use: each snippet a fresh process forked from
    a server that imported torch once."""

    def __init__(self) -> None:
        self._process: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self._pending = b""  # read from the server's stdout, not yet a whole line

    def _server(self) -> subprocess.Popen:
        if self._process is None or self._process.poll() is not None:
            base_env = {k: v for k, v in os.environ.items() if not k.startswith(("DITORCH_", "DIOPI_"))}
            self._process = subprocess.Popen([sys.executable, str(Path(__file__).with_name("snippet_server.py"))],
                                             cwd=REPO_ROOT, env=base_env, stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE, text=True, bufsize=1)
            atexit.register(self._process.stdin.close)
            self._pending = b""
        return self._process

    def _reply(self, server: subprocess.Popen, deadline: float) -> dict:
        # Read from the descriptor, not the file object: its buffer could hold the next line (a snippet
        # that ends at once) where select() does not look, and the wait would run to the deadline.
        fd = server.stdout.fileno()
        while b"\n" not in self._pending:
            if not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
                raise TimeoutError
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise RuntimeError("the snippet server exited")
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        return json.loads(line)

    def run(self, code: str, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
        with self._lock, tempfile.TemporaryDirectory() as tmp:
            out, err = Path(tmp, "stdout"), Path(tmp, "stderr")
            server = self._server()
            server.stdin.write(json.dumps({"code": code, "env": env, "stdout": str(out), "stderr": str(err)}) + "\n")
            deadline = time.monotonic() + timeout
            pid = self._reply(server, deadline)["pid"]
            try:
                returncode = self._reply(server, deadline)["returncode"]
            except TimeoutError:
                os.kill(pid, signal.SIGKILL)
                self._reply(server, time.monotonic() + 30)
                raise subprocess.TimeoutExpired(code, timeout, out.read_text(), err.read_text()) from None
            return subprocess.CompletedProcess(code, returncode, out.read_text(), err.read_text())


_snippets = SnippetServer()


def run_python(code: str, env: dict[str, str] | None = None, timeout: float = 240) -> dict:
    """Run ``code`` as a fresh interpreter would (the device registers itself once per process, before
    the first backward pass): a process of its own, forked from a server that imported torch once; its
    last stdout line is JSON."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("DITORCH_", "DIOPI_"))}
    full_env.update(env or {})
    done = _snippets.run(textwrap.dedent(code), full_env, timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["_stderr"] = done.stderr
    return result


def enable_error(library: str, env: dict[str, str] | None = None, prelude: str = "",
                 **enable_kwargs: str) -> str | None:
    """``device.enable(library, **enable_kwargs)`` in a fresh interpreter after ``prelude``: the
    DiopiDeviceError's message, or None if it enabled."""
    kwargs = "".join(f", {k}={v!r}" for k, v in enable_kwargs.items())
    return run_python(f"""
        import json, torch
        {prelude}
        from diopi_bindings import device
        try:
            device.enable({library!r}{kwargs})
            print(json.dumps({{"error": None}}))
        except device.DiopiDeviceError as exc:
            print(json.dumps({{"error": str(exc)}}))
    """, env=env)["error"]
