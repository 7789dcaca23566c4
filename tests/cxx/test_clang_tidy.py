"""clang-tidy over the engine (dicomm/csrc) and the precision module's op hook (precision/csrc), headers
included, with the checks in .clang-tidy, every finding an error. It reads the compile commands of a
configured (not built) build/tidy folder.
Where clang-tidy is not installed the test skips and says so; CI installs it (.ci/run) and runs it.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.cxx import cxx_build

# Clang does not know GCC's `#pragma GCC target` (the AVX2 kernels) nor GCC's LTO flags in the
# compile commands; neither is a finding about the code.
CLANG_ONLY_NOISE = ["--extra-arg=-Wno-unknown-pragmas", "--extra-arg=-Wno-ignored-optimization-argument"]


def _clang_tidy() -> str:
    for name in ("clang-tidy", *(f"clang-tidy-{v}" for v in range(20, 13, -1))):
        if shutil.which(name):
            return name
    cxx_build.missing("clang-tidy is not installed (Debian: apt-get install clang-tidy)")
    raise AssertionError("unreachable")


CHECKED = ("dicomm/csrc", "precision/csrc")


def _checked_sources(build) -> dict[str, list[str]]:
    commands = json.loads((build / "compile_commands.json").read_text())
    out = {}
    for folder in CHECKED:
        root = str(cxx_build.REPO / folder) + os.sep
        out[folder] = sorted({c["file"] for c in commands if c["file"].startswith(root)})
    return out


@pytest.mark.timeout(1200)
def test_engine_and_precision_hook_are_clean_under_clang_tidy():
    tidy = _clang_tidy()
    build = cxx_build.configure("tidy")
    sources = _checked_sources(build)
    engine = sources["dicomm/csrc"]
    assert len(engine) > 40, f"only {len(engine)} engine sources in the compile commands"
    assert len(sources["precision/csrc"]) >= 8, f"only {sources['precision/csrc']} of the precision module"
    files = [f for folder in CHECKED for f in sources[folder]]

    def run(batch: list[str]) -> tuple[int, str]:
        p = subprocess.run([tidy, "-p", str(build), "--quiet", *CLANG_ONLY_NOISE, *batch], cwd=cxx_build.REPO,
                           capture_output=True, text=True, timeout=1100)
        return p.returncode, p.stdout

    batches = [files[i:i + 4] for i in range(0, len(files), 4)]
    with ThreadPoolExecutor(max_workers=max(1, min(os.cpu_count() or 1, 4))) as pool:
        results = list(pool.map(run, batches))
    findings = "".join(out for _, out in results)
    failed = [b for b, (rc, _) in zip(batches, results) if rc != 0]
    assert not failed and not findings.strip(), f"clang-tidy findings in {failed}:\n{findings[-12000:]}"
