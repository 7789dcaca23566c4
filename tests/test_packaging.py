"""What `pip install` puts into site-packages: the wheel is built from this checkout, unpacked into a
directory of its own, and its console scripts are run from there with the repository out of reach
(`python -S`: no .pth files, so no editable-install finder; torch and the other dependencies come from
the environment's site-packages, placed after the unpacked wheel)."""
from __future__ import annotations

import configparser
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The project's import names, each of which says whose it is: generic names (`bench`, `precision`,
# `tests`...) collide with other distributions' top-level names.
OURS = {"ditorch", "dicomm", "diopi_bindings", "ditorch_precision", "heteropp"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation",
                           "-q", "-w", str(out)], capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout + done.stderr
    (found,) = out.glob("ditorch-*.whl")
    return found


@pytest.fixture(scope="module")
def unpacked(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("site")
    with zipfile.ZipFile(wheel) as z:
        z.extractall(target)
    return target


def _entry_points(unpacked: Path) -> configparser.ConfigParser:
    (info,) = unpacked.glob("ditorch-*.dist-info")
    parser = configparser.ConfigParser()
    parser.read(info / "entry_points.txt")
    return parser


def test_the_wheel_has_only_the_projects_own_top_level_names(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    top = {name.split("/")[0] for name in names}
    packages = {name for name in top if not name.endswith(".dist-info")}
    assert packages == OURS, f"unexpected top-level names: {sorted(packages ^ OURS)}"
    test_modules = [name for name in names if "toy_transport" in name or name.startswith("tests/")]
    assert not test_modules, f"test-only modules in the wheel: {test_modules}"


def test_every_console_script_runs_from_the_installed_wheel(unpacked: Path, tmp_path: Path) -> None:
    scripts = dict(_entry_points(unpacked)["console_scripts"])
    assert {"dicomm-bench", "precision-diff", "precision-run", "heteroauto", "heteropp", "dicomm-topo",
            "diopi-conformance"} <= set(scripts)
    site = sysconfig.get_paths()["purelib"]
    for name, target in sorted(scripts.items()):
        module, func = target.split(":")
        code = (f"import sys; sys.path[:0] = [{str(unpacked)!r}, {site!r}]; sys.argv = [{name!r}, '--help']\n"
                f"import {module} as m\n"
                f"assert m.__file__.startswith({str(unpacked)!r}), m.__file__\n"
                f"sys.exit(m.{func}())")
        done = subprocess.run([sys.executable, "-S", "-c", code], cwd=tmp_path, capture_output=True, text=True,
                              timeout=300, env={"PATH": "/usr/bin:/bin", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
        assert done.returncode == 0, f"{name}: {done.stdout}{done.stderr}"
        assert "usage" in done.stdout.lower(), f"{name}: no help text: {done.stdout!r}"
