"""Building the reference library outside the package build: variants for tests (operators left
out, one kernel planted wrong) and a quick way for a vendor to compile the template."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

REFERENCE_SOURCES = Path(__file__).resolve().parent / "reference"


def build_reference(build_dir: str | os.PathLike, *, name: str = "diopi_reference", omit: tuple[str, ...] = (),
                    plant_wrong: str | tuple[str, ...] | None = None, jobs: int = 2) -> Path:
    """Configure and build the reference library in ``build_dir``; returns the path of the .so.
    ``omit``: operator symbols not to export; ``plant_wrong``: the symbol(s) whose results are off by 1%
    (integers by one)."""
    planted = ",".join((plant_wrong,) if isinstance(plant_wrong, str) else plant_wrong or ())
    build_dir = Path(build_dir)
    configure = ["cmake", "-S", str(REFERENCE_SOURCES), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release",
                 f"-DDIOPI_REF_NAME={name}", f"-DDIOPI_REF_OMIT={';'.join(omit)}",
                 f"-DDIOPI_REF_PLANT_WRONG={planted}"]
    for cmd in (configure, ["cmake", "--build", str(build_dir), f"-j{jobs}"]):
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd[:2])} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return build_dir / f"lib{name}.so"
