"""Report import cycles among the project's modules: ``python tools/import_cycles.py`` (exit 1 on a cycle).

Every import counts, at module level or inside a function, except those under ``if TYPE_CHECKING:``: a
deferred import hides a cycle from the interpreter, not from the reader. Package ``__init__`` modules are
left out, since a package re-exporting its submodules is not a design cycle.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGES = ("ditorch", "dicomm", "diopi_bindings", "ditorch_precision", "heteropp", "bench")
# An import name whose files live under a directory of another path (pyproject.toml's wheel.packages).
DIRECTORIES = {"ditorch_precision": "precision/ditorch_precision"}


def _module_name(root: Path, path: Path, package: str) -> str:
    parts = [package, *path.relative_to(root / DIRECTORIES.get(package, package)).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.Module, module: str) -> set[str]:
    """Names a (non-package) module imports: absolute, possibly not project modules."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")[:-1]  # the module's package
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def import_graph(root: Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    """module -> project modules it imports (package __init__ modules excluded)."""
    files: dict[str, Path] = {}
    for package in packages:
        directory = root / DIRECTORIES.get(package, package)
        if not (directory / "__init__.py").is_file():  # a renamed package must not drop out unseen
            raise FileNotFoundError(f"{directory}: no such package; update PACKAGES in {Path(__file__).name}")
        for path in sorted(directory.rglob("*.py")):
            if path.name != "__init__.py":
                files[_module_name(root, path, package)] = path
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        imported = _imports(ast.parse(path.read_text(), str(path)), name)
        graph[name] = {m for m in imported if m in files and m != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(10000, sys.getrecursionlimit()))
    for v in sorted(graph):
        if v not in index:
            connect(v)
    return sorted(found)


def main() -> int:
    root = Path(__file__).resolve().parent.parent
    found = cycles(import_graph(root))
    for component in found:
        print("import cycle: " + " <-> ".join(component))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
