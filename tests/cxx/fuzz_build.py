"""The wire-parser fuzz targets (tests/cxx/fuzz/fuzz_*.cpp): each is linked with the engine's
objects from the AddressSanitizer + UndefinedBehaviorSanitizer build (build/asan, the one
test_sanitizers uses), so a parser that reads or writes outside its buffers aborts with a report.

With clang, a target is built for libFuzzer (-fsanitize=fuzzer: coverage-guided); elsewhere
(GCC) its own driver feeds it random inputs (tests/cxx/fuzz/fuzz_main.h). `make test` runs each
for a few seconds (tests/cxx/test_fuzz.py); `make fuzz` runs each for longer:

    python -m tests.cxx.fuzz_build [seconds per target, default 300]
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FUZZ_DIR = Path(__file__).with_name("fuzz")
TARGETS = sorted(p.stem for p in FUZZ_DIR.glob("fuzz_*.cpp"))
SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"]


def engine_objects(build: Path) -> list[str]:
    objs = sorted(str(p) for p in build.glob("CMakeFiles/dicomm_engine.dir/**/*.o"))
    if not objs:
        raise RuntimeError(f"{build} holds no dicomm_engine objects: build its dicomm_engine target first")
    return objs


def uses_libfuzzer(cxx: str) -> bool:
    probe = subprocess.run([cxx, "--version"], capture_output=True, text=True)
    return "clang" in probe.stdout


def link(target: str, build: Path, out_dir: Path, cxx: str | None = None) -> Path:
    """Builds fuzz target `target` into out_dir (again only when its sources are newer)."""
    cxx = cxx or os.environ.get("CXX", "c++")
    out_dir.mkdir(parents=True, exist_ok=True)
    exe = out_dir / target
    src = FUZZ_DIR / f"{target}.cpp"
    objs = engine_objects(build)
    newest = max(os.path.getmtime(p) for p in [src, FUZZ_DIR / "fuzz_main.h", *objs])
    if exe.exists() and os.path.getmtime(exe) >= newest:
        return exe
    libfuzzer = uses_libfuzzer(cxx)
    flags = ["-std=c++17", "-O1", "-g", *SANITIZE, f"-I{REPO / 'dicomm' / 'csrc'}"]
    if libfuzzer:
        flags = [*flags, "-fsanitize=fuzzer", "-DDICOMM_LIBFUZZER"]
    cmd = [cxx, *flags, str(src), *objs, "-o", str(exe), "-lpthread", "-ldl"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"building {target} failed:\n{done.stderr[-6000:]}")
    return exe


def run(exe: Path, seconds: float, seed: int = 1) -> subprocess.CompletedProcess[str]:
    """Runs a target for `seconds`; a finding makes it exit non-zero with the sanitizer's report."""
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0:abort_on_error=0:halt_on_error=1",
               UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1")
    if uses_libfuzzer(os.environ.get("CXX", "c++")):
        cmd = [str(exe), f"-max_total_time={int(seconds)}", f"-seed={seed}"]
    else:
        cmd = [str(exe), str(seconds), str(seed)]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=seconds + 120)


def main(argv: list[str]) -> int:
    seconds = float(argv[0]) if argv else 300.0
    if shutil.which("cmake") is None:
        print("fuzz: cmake is not installed", file=sys.stderr)
        return 2
    import pybind11

    build = REPO / "build" / "asan"
    subprocess.run(["cmake", "-S", str(REPO), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release", "-DCMAKE_CXX_FLAGS=-g1",
                    "-DDICOMM_SANITIZE=address;undefined", f"-DPython_EXECUTABLE={sys.executable}",
                    f"-Dpybind11_DIR={pybind11.get_cmake_dir()}"], check=True, capture_output=True)
    subprocess.run(["cmake", "--build", str(build), "-j", str(os.cpu_count() or 1), "--target", "dicomm_engine"],
                   check=True)
    failed = 0
    for target in TARGETS:
        exe = link(target, build, REPO / "build" / "fuzz")
        done = run(exe, seconds)
        print(f"{target}: exit {done.returncode}: {done.stdout.strip().splitlines()[-1:] or ''}")
        if done.returncode != 0:
            failed += 1
            print(done.stderr[-8000:], file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
