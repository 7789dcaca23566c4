"""The test builds of the reference library: every variant the DIOPI tests load comes from one cmake build
that compiles the reference's sources once (each variant adds its own planted_wrong.cpp and a link). What each
variant exports is checked against the package's reference library, built by the project's own CMake."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from diopi_testlib import symbol, variants_to_build

from diopi_bindings.build import ReferenceVariant, build_reference, build_reference_variants
from diopi_bindings.conformance.cli import main


def exported(library: Path) -> set[str]:
    """The defined dynamic symbols, as nm lists them."""
    if shutil.which("nm") is None:
        pytest.skip("nm is not installed")
    done = subprocess.run(["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True, check=True)
    return {line.split()[-1] for line in done.stdout.splitlines()}


def test_each_variant_exports_the_reference_symbols_but_its_omitted_ones(reference_variants, reference_path):
    reference = exported(reference_path)
    for variant in variants_to_build():
        assert set(variant.omit) <= reference
        assert exported(reference_variants[variant.name]) == reference - set(variant.omit), variant.name


def test_the_sources_are_compiled_once_for_all_variants(reference_variants):
    build_dir = next(iter(reference_variants.values())).parent
    objects = [p.name for p in build_dir.rglob("*.o")]
    assert objects.count("tensor_io.cpp.o") == 1 and objects.count("dense_float.cpp.o") == 1
    for name in reference_variants:  # each variant compiles only its own planted_wrong.cpp
        assert (build_dir / "CMakeFiles" / f"{name}.dir" / "planted_wrong.cpp.o").is_file(), name


def test_build_reference_adds_one_library_to_a_build_directory(reference_variants, reference_path, tmp_path):
    """The single-library builder (a vendor's template build) with an omitted and a planted symbol. It reuses the
    variants' build directory, so only its planted_wrong.cpp is compiled; the other variants stay as they are."""
    build_dir = next(iter(reference_variants.values())).parent
    before = {name: path.stat().st_mtime_ns for name, path in reference_variants.items()}
    lib = build_reference(build_dir, name="diopi_single", omit=(symbol("aten::gelu"),),
                          plant_wrong=symbol("aten::neg"))
    assert exported(lib) == exported(reference_path) - {symbol("aten::gelu")}
    report = tmp_path / "single.json"
    assert main(["--impl", str(lib), "--ops", "aten::neg", "aten::gelu", "aten::exp", "--json", str(report),
                 "-q"]) == 1
    verdicts = {op: v["verdict"] for op, v in json.loads(report.read_text())["operators"].items()}
    assert verdicts == {"aten::neg": "fail", "aten::gelu": "not implemented", "aten::exp": "pass"}
    assert {name: path.stat().st_mtime_ns for name, path in reference_variants.items()} == before


@pytest.mark.parametrize(("variants", "message"), [
    ([], "no variants given"),
    ([ReferenceVariant("a:b")], "'a:b' is not a C identifier"),
    ([ReferenceVariant("v", omit=("diopi_x;diopi_y",))], "variant 'v': omitted symbol: 'diopi_x;diopi_y'"),
    ([ReferenceVariant("v", plant_wrong="diopi_aten_mm")], "got the string 'diopi_aten_mm'"),  # type: ignore[arg-type]
    ([ReferenceVariant("v"), ReferenceVariant("v")], "'v' is given more than once"),
    ([ReferenceVariant("diopi_reference")], "'diopi_reference' is a target of the reference build itself"),
])
def test_bad_variants_are_refused_before_cmake_runs(tmp_path, variants, message):
    with pytest.raises(ValueError, match=message):
        build_reference_variants(tmp_path / "build", variants)
    assert not (tmp_path / "build").exists()


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"omit": "diopi_aten_gelu"}, "got the string 'diopi_aten_gelu'"),  # not split into one-letter symbols
    ({"name": "lib;x"}, "'lib;x' is not a C identifier"),
    ({"plant_wrong": ("diopi_aten_neg,diopi_aten_exp",)}, "planted symbol: 'diopi_aten_neg,diopi_aten_exp'"),
])
def test_bad_arguments_of_build_reference_are_refused_before_cmake_runs(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        build_reference(tmp_path / "build", **kwargs)
    assert not (tmp_path / "build").exists()
