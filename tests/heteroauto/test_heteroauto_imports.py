"""heteropp/auto has no import cycles, function-level imports included (a cycle hidden in a function body
is still one: the modules cannot be read or tested apart)."""
from __future__ import annotations

import ast
from pathlib import Path

AUTO = Path(__file__).resolve().parents[2] / "heteropp" / "auto"


def _graph() -> dict[str, set[str]]:
    out = {}
    for f in AUTO.glob("*.py"):
        deps = set()
        for n in ast.walk(ast.parse(f.read_text())):
            if isinstance(n, ast.ImportFrom) and n.level == 1 and n.module:
                deps.add(n.module.split(".")[0])
        out[f.stem] = deps
    return out


def test_no_import_cycles():
    graph, state, cycles = _graph(), {}, []

    def visit(m: str, path: list[str]) -> None:
        state[m] = "open"
        for d in sorted(graph.get(m, ())):
            if state.get(d) == "open":
                cycles.append(path[path.index(d):] + [d])
            elif d not in state:
                visit(d, path + [d])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not cycles, f"import cycles: {cycles}"
    assert {"search", "dpspace", "h2"} <= set(graph)  # the modules that formed one


def test_no_import_cycles_anywhere_in_heteropp():
    """The project's cycle checker (tools/import_cycles.py) over the whole package: schedules, engine, spec
    too (the schedule registry and its generators once imported each other)."""
    import importlib.util
    root = AUTO.parents[1]
    spec = importlib.util.spec_from_file_location("import_cycles", root / "tools" / "import_cycles.py")
    assert spec is not None and spec.loader is not None
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    graph = tool.import_graph(root)
    assert "heteropp.schedules.registry" in graph  # the checker sees the package
    found = [c for c in tool.cycles(graph) if any(m.startswith("heteropp.") for m in c)]
    assert not found, f"import cycles: {found}"
