"""Action.op is an Op enum (heteropp/schedules/actions.py), and the planner, the schedules and the engine that
runs them compare it with the enum's members, not with letters: a misspelt letter ("f", "SEND") compared
with a str enum is silently False, where a misspelt member fails on import."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "heteropp"
CHECKED = ("auto", "schedules", "engine")


def _letters(node: ast.expr) -> list[str]:
    """The str constants `node` is, or holds as a tuple, list or set."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [x for e in node.elts for x in _letters(e)]
    return []


def _op_compared_with_letters(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        if any(isinstance(x, ast.Attribute) and x.attr == "op" for x in sides):
            letters = [s for x in sides for s in _letters(x)]
            if letters:
                found.append((node.lineno, ", ".join(letters)))
    return found


def test_the_check_finds_a_letter_comparison():
    tree = ast.parse('if a.op == "F" or a.op in ("B", "I"):\n    pass\nif a.op is Op.F:\n    pass\n')
    assert _op_compared_with_letters(tree) == [(1, "F"), (1, "B, I")]


def test_action_ops_are_compared_with_the_enum():
    bad = [f"{path.relative_to(ROOT.parent)}:{line}: {letters}"
           for folder in CHECKED for path in sorted((ROOT / folder).rglob("*.py"))
           for line, letters in _op_compared_with_letters(ast.parse(path.read_text()))]
    assert not bad, "Action.op compared with letters instead of Op members:\n" + "\n".join(bad)
