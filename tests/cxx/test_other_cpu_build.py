"""The package's C++ builds for a CPU other than x86-64: Ascend cards sit in aarch64 hosts. Every source
that holds CPU-specific code (x86 intrinsics, `target`/`target_clones` attributes, `#pragma GCC target`)
is compiled for aarch64 with its own compile command from the build's compile database (the cross
compiler in place of the host's, warnings errors as in CI). Where the cross compiler is missing the
test skips and says so; CI installs it (.ci/run) and runs it."""
from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess

import pytest

from tests.cxx import cxx_build

CROSS = "aarch64-linux-gnu-g++"
CPU_SPECIFIC = re.compile(
    r"immintrin\.h|cpu_clones\.h|cpu_features\.h|cpuid\.h|target_clones|__attribute__\(\(target\(|"
    r"#pragma GCC target|_mm256_|__builtin_ia32_|__builtin_cpu_|asm volatile")


def _cpu_specific_commands(build) -> list[tuple[str, list[str]]]:
    out = []
    for c in json.loads((build / "compile_commands.json").read_text()):
        path = c["file"]
        with open(path, encoding="utf-8") as f:
            if not CPU_SPECIFIC.search(f.read()):
                continue
        args = c["arguments"] if "arguments" in c else shlex.split(c["command"])
        args = [CROSS, *args[1:]]
        args[args.index("-o") + 1] = "/dev/null"
        out.append((path, args))
    return out


@pytest.mark.timeout(900)
def test_cpu_specific_sources_build_for_aarch64():
    if shutil.which(CROSS) is None:
        cxx_build.missing(f"{CROSS} is not installed (Debian: apt-get install g++-aarch64-linux-gnu)")
    build = cxx_build.configure("tidy")
    commands = _cpu_specific_commands(build)
    names = {p.rsplit("/", 2)[-2] + "/" + p.rsplit("/", 1)[-1] for p, _ in commands}
    # the engine's reduction kernels, the precision statistics and the DIOPI reference's loops at least
    assert {"reduce/kernels_avx2.cpp", "reduce/reduce.cpp", "core/progress.cpp", "csrc/fused_stats.cpp",
            "reference/dense_float.cpp", "deeplink/fast_matmul.cpp"} <= names, names
    failed = []
    for path, args in commands:
        p = subprocess.run(args, cwd=build, capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            failed.append(f"{path}:\n{p.stderr[-3000:]}")
    assert not failed, "sources that do not build for aarch64:\n" + "\n".join(failed)
