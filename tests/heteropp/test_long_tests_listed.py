"""Every heteropp test marked long_test (skipped by `make test`) is named in the Makefile's LONG_TESTS, so
`make test-long` runs it: a marked test missing there would run in no target."""
from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _long_tests_of_make() -> set[str]:
    text = (REPO / "Makefile").read_text().replace("\\\n", " ")
    return set(re.search(r"^LONG_TESTS :=(.*)$", text, re.M).group(1).split())


def _is_long_test(node: ast.expr) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "long_test"


def _marked() -> set[str]:
    """'path' for a module marked whole, 'path::name' for each marked test function."""
    out = set()
    for path in sorted((REPO / "tests" / "heteropp").glob("test_*.py")):
        rel = path.relative_to(REPO).as_posix()
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytestmark" for t in node.targets) \
                    and _is_long_test(node.value):
                out.add(rel)
            elif isinstance(node, ast.FunctionDef) and any(_is_long_test(d) for d in node.decorator_list):
                out.add(f"{rel}::{node.name}")
    return out


def test_every_long_test_is_run_by_make_test_long():
    listed = _long_tests_of_make()
    marked = _marked()
    assert len(marked) >= 8  # the marker is found at all (eight files use it)
    missing = {m for m in marked if m not in listed and m.split("::")[0] not in listed}
    assert missing == set(), f"marked long_test but not in the Makefile's LONG_TESTS: {sorted(missing)}"
