"""Building the reference library outside the package build: variants for tests (operators left
out, kernels planted wrong) and a quick way for a vendor to compile the template."""
from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REFERENCE_SOURCES = Path(__file__).resolve().parent / "reference"

# Library names and symbols travel through CMake lists (';', ',' and ':' separate them): C identifiers only.
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Targets the reference's CMakeLists defines itself.
_TAKEN_NAMES = frozenset({"diopi_reference", "diopi_reference_objects", "diopi_reference_deeplink"})


@dataclass(frozen=True)
class ReferenceVariant:
    """One test library: the reference with ``omit`` not exported and ``plant_wrong`` computing wrong."""
    name: str
    omit: tuple[str, ...] = ()
    plant_wrong: tuple[str, ...] = ()


def _planted(plant_wrong: str | tuple[str, ...] | None) -> tuple[str, ...]:
    return (plant_wrong,) if isinstance(plant_wrong, str) else tuple(plant_wrong or ())


def _check_identifiers(what: str, values: Sequence[str]) -> None:
    if isinstance(values, str):
        raise ValueError(f"{what}s: got the string {values!r} (expected a tuple of symbols)")
    for value in values:
        if not isinstance(value, str) or not _IDENTIFIER.fullmatch(value):
            raise ValueError(f"{what}: {value!r} is not a C identifier (expected letters, digits and '_', "
                             "not starting with a digit)")


def _check_variant(variant: ReferenceVariant) -> None:
    _check_identifiers("variant name", (variant.name,))
    _check_identifiers(f"variant {variant.name!r}: omitted symbol", variant.omit)
    _check_identifiers(f"variant {variant.name!r}: planted symbol", variant.plant_wrong)


def _run_cmake(build_dir: Path, definitions: dict[str, str], targets: Sequence[str], jobs: int) -> None:
    configure = ["cmake", "-S", str(REFERENCE_SOURCES), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release",
                 *(f"-D{key}={value}" for key, value in definitions.items())]
    build = ["cmake", "--build", str(build_dir), f"-j{jobs}", *(["--target", *targets] if targets else [])]
    for cmd in (configure, build):
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd[:2])} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")


def build_reference(build_dir: str | os.PathLike, *, name: str = "diopi_reference", omit: tuple[str, ...] = (),
                    plant_wrong: str | tuple[str, ...] | None = None, jobs: int = 2) -> Path:
    """Configure and build the reference library in ``build_dir``; returns the path of the .so.
    ``omit``: operator symbols not to export; ``plant_wrong``: the symbol(s) whose results are off by 1%
    (integers by one)."""
    library = ReferenceVariant(name, omit, _planted(plant_wrong))
    _check_variant(library)
    build_dir = Path(build_dir)
    _run_cmake(build_dir, {"DIOPI_REF_NAME": name, "DIOPI_REF_OMIT": ";".join(omit),
                           "DIOPI_REF_PLANT_WRONG": ",".join(library.plant_wrong)}, (), jobs)
    return build_dir / f"lib{name}.so"


def build_reference_variants(build_dir: str | os.PathLike, variants: Sequence[ReferenceVariant],
                             jobs: int = 2) -> dict[str, Path]:
    """Build several test libraries in one cmake build of ``build_dir``: the reference's sources are compiled
    once, each variant adds its own planted_wrong.cpp and a link. Returns each variant's .so by name."""
    if not variants:
        raise ValueError("build_reference_variants: no variants given (expected at least one ReferenceVariant)")
    names = [v.name for v in variants]
    for variant in variants:
        _check_variant(variant)
    taken = sorted(_TAKEN_NAMES.intersection(names))
    if taken:
        raise ValueError(f"variant name {taken[0]!r} is a target of the reference build itself "
                         f"(expected a name other than {sorted(_TAKEN_NAMES)})")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"variant name {repeated[0]!r} is given more than once (expected one variant per name)")
    entries = ";".join(f"{v.name}:{','.join(v.omit)}:{','.join(v.plant_wrong)}" for v in variants)
    build_dir = Path(build_dir)
    _run_cmake(build_dir, {"DIOPI_REF_VARIANTS": entries}, names, jobs)
    return {name: build_dir / f"lib{name}.so" for name in names}
