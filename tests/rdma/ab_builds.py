"""Two builds of dicomm compared by 8 B ping-pong over Soft-RoCE, paired inside the same processes:

    .venv/bin/python -m tests.rdma.ab_builds REV_A REV_B [--runs 4] [--blocks 16] [--iters 2000]

REV is a git revision, or `.` for the working tree as it is. Separate runs of one build differ by
whole modes under QEMU TCG (15.7 against 18.7 us), which swamps sub-microsecond changes. Here each
run starts two ranks that load both builds, make one communicator with each and alternate blocks of
round trips between them; runs alternate which build is made first. Each build is compiled as a
module of its own name (`PYBIND11_MODULE` and the CMake target renamed, its own pybind11 internals
id): loaded under one name, two files are one module, as Python hands back the first.

Prints, per run, both builds' medians and the median of the per-block differences (B - A), then the
median over runs. A/A runs (one revision twice) measured 0.3-0.45 us apart: read single runs below
that as noise.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from tests.rdma import guest, lab

# What the module's build files must contain, and what each becomes in a renamed build.
# The benchmark module (its `_pingpong` loop) is renamed with it and imports the renamed engine.
RENAMES = {
    "dicomm/csrc/python/module.cpp": [("PYBIND11_MODULE(_C,", "PYBIND11_MODULE({mod},")],
    "dicomm/csrc/python/bench_bindings.cpp": [("PYBIND11_MODULE(_C_bench,", "PYBIND11_MODULE({mod}_bench,"),
                                              ('import("dicomm._C")', 'import("dicomm.{mod}")')],
    "CMakeLists.txt": [("pybind11_add_module(_C ", "pybind11_add_module({mod} "),
                       ("target_link_libraries(_C ", "target_link_libraries({mod} "),
                       ("install(TARGETS _C ", "install(TARGETS {mod} "),
                       ("pybind11_add_module(_C_bench ", "pybind11_add_module({mod}_bench "),
                       ("target_include_directories(_C_bench ", "target_include_directories({mod}_bench "),
                       ("install(TARGETS _C_bench ", "install(TARGETS {mod}_bench ")],
}


def _sh(cmd: list[str], what: str, cwd: Path | None = None, timeout: int = 900) -> str:
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise SystemExit(f"{what} failed (exit {p.returncode}):\n{(p.stderr or p.stdout)[-3000:]}")
    return p.stdout


def export(rev: str, dest: Path) -> None:
    """The tree of `rev` (or the working tree's tracked and untracked, not ignored, files) in dest."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    if rev == ".":
        files = _sh(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], "git ls-files", lab.REPO)
        for name in filter(None, files.split("\0")):
            src = lab.REPO / name
            if src.is_file():
                (dest / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest / name)
    else:
        archive = subprocess.run(["git", "archive", "--format=tar", rev], cwd=lab.REPO, capture_output=True,
                                 timeout=300)
        if archive.returncode != 0:
            raise SystemExit(f"git archive {rev}: {archive.stderr.decode()[-2000:]}")
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True, timeout=300)


def build(rev: str, mod: str, work: Path) -> str:
    """Builds `rev` as the module `mod` and its benchmark module; returns "CORE.so,BENCH.so"."""
    src = work / f"src_{mod}"
    export(rev, src)
    for rel, pairs in RENAMES.items():
        path = src / rel
        text = path.read_text()
        for old, new in pairs:
            if old not in text:
                raise SystemExit(f"{rev}: {rel} has no '{old}'; update RENAMES in {Path(__file__).name}")
            text = text.replace(old, new.format(mod=mod))
        if rel == "CMakeLists.txt":
            for target in (mod, f"{mod}_bench"):
                text += f'\ntarget_compile_definitions({target} PRIVATE PYBIND11_COMPILER_TYPE="_{mod}")\n'
        path.write_text(text)
    import pybind11

    out = src / "build"
    _sh(["cmake", "-S", str(src), "-B", str(out), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
         f"-DPython_EXECUTABLE={sys.executable}", f"-Dpybind11_DIR={pybind11.get_cmake_dir()}"], f"configuring {rev}")
    _sh(["cmake", "--build", str(out), "--target", mod, f"{mod}_bench"], f"building {rev}", timeout=1800)
    built = []
    for name in (mod, f"{mod}_bench"):
        (so,) = out.glob(f"{name}.*.so")
        shutil.copy2(so, work / f"{name}.so")
        built.append(str(work / f"{name}.so"))
    return ",".join(built)


def session(a: str, b: str, runs: int, blocks: int, iters: int) -> str:
    script = Path(__file__).with_name("ab_pingpong.py").relative_to(lab.REPO)
    lines = ["source tests/rdma/guest_lib.sh", "export TORCH_DEVICE_BACKEND_AUTOLOAD=0"]
    for r in range(runs):
        first, second = (a, b) if r % 2 == 0 else (b, a)
        args = f"{29700 + r} {blocks} {iters} {first} {second} $RESULTS/run{r}.json"
        # $RESULTS expands here; the inner shell sees \$? and \$!.
        lines.append(f'step run{r} 400 bash -c ".venv/bin/python {script} 1 {args} & '
                     f'.venv/bin/python {script} 0 {args}; rc=\\$?; wait \\$! || rc=1; exit \\$rc"')
    return "\n".join(lines)


def summarize(files: dict, names: tuple[str, str]) -> tuple[list[str], list[float]]:
    lines, diffs = [], []
    for r in range(100):
        text = files.get(f"run{r}.json")
        if text is None:
            break
        res = json.loads(text)
        by = dict(zip(res["builds"], res["medians_us"]))
        ma, mb = by[names[0]], by[names[1]]
        d = [y - x for x, y in zip(ma, mb)]
        diffs.append(statistics.median(d))
        lines.append(f"run {r} ({res['builds'][0]} made first): A {statistics.median(ma):.2f} us, "
                     f"B {statistics.median(mb):.2f} us, B - A {diffs[-1]:+.2f} us (B faster in "
                     f"{sum(x < 0 for x in d)} of {len(d)} blocks)")
    return lines, diffs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("rev_a")
    ap.add_argument("rev_b")
    ap.add_argument("--runs", type=int, default=4, help="process pairs, alternating which build is made first")
    ap.add_argument("--blocks", type=int, default=16, help="blocks per build and run")
    ap.add_argument("--iters", type=int, default=2000, help="round trips per block")
    args = ap.parse_args()
    if why := lab.unavailable_reason():
        print(f"Soft-RoCE lab unavailable: {why}", file=sys.stderr)
        return 2
    work = lab.LAB / "ab"
    a = build(args.rev_a, "_ab_a", work)
    b = build(args.rev_b, "_ab_b", work)
    res = guest.run(session(a, b, args.runs, args.blocks, args.iters),
                    timeout_s=120 + args.runs * (60 + args.blocks * args.iters * 2e-4))
    lines, diffs = summarize(res.files, (Path(a.split(",")[0]).name, Path(b.split(",")[0]).name))
    if res.rc != 0 or len(diffs) != args.runs:
        print(res.describe(), file=sys.stderr)
        return 1
    print(f"A = {args.rev_a}, B = {args.rev_b}; 8 B half round trip, block medians")
    print("\n".join(lines))
    print(f"median over runs of B - A: {statistics.median(diffs):+.2f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
