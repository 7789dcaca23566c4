"""The static checks CI runs: ruff (pycodestyle, pyflakes, bugbear), mypy (strict where pyproject.toml says)
and the import-cycle check. The tools come with the `test` extras, so a missing tool is a failure here."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import import_cycles  # noqa: E402  (tools/ is not a package)


def _tool(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    if importlib.util.find_spec(module) is None:
        pytest.fail(f"{module} is not installed: `pip install -e .[test]` installs it")
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


def test_ruff_finds_nothing() -> None:
    done = _tool("ruff", "check", "--no-cache", "--output-format", "concise", ".")
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_strict_modules_type_check() -> None:
    done = _tool("mypy", "--no-incremental")
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_project_has_no_import_cycles() -> None:
    assert import_cycles.cycles(import_cycles.import_graph(ROOT)) == []


def test_the_cycle_check_finds_a_planted_cycle(tmp_path: Path) -> None:
    # a -> b -> c -> a through a function-level and a relative import; d imports a without a cycle;
    # e imports c only for typing.
    pkg = tmp_path / "heteropp"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from . import a, b\n")
    (pkg / "a.py").write_text("from heteropp import b\n")
    (pkg / "b.py").write_text("def f():\n    from .c import g\n    return g\n")
    (pkg / "c.py").write_text("import heteropp.a\n")
    (pkg / "d.py").write_text("from .a import x\n")
    (pkg / "e.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .c import g\n")
    (tmp_path / "other.py").write_text("import heteropp.e\n")
    graph = import_cycles.import_graph(tmp_path, ("heteropp",))
    assert graph["heteropp.d"] == {"heteropp.a"} and graph["heteropp.e"] == set()
    assert import_cycles.cycles(graph) == [["heteropp.a", "heteropp.b", "heteropp.c"]]


def test_the_cycle_check_refuses_a_package_that_is_not_there(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="heteropp"):
        import_cycles.import_graph(tmp_path, ("heteropp",))
