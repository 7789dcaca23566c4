"""Which ops a tool acts on: op names, module paths, steps, ranks, phases (all optional)."""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from functools import lru_cache


def parse_int_set(text: str | None) -> frozenset[int] | None:
    """'0,2-4' -> {0, 2, 3, 4}; empty or None -> None (everything)."""
    if text is None or not str(text).strip():
        return None
    out: set[int] = set()
    for part in str(text).split(","):
        part = part.strip()
        try:
            if "-" in part:
                lo, hi = part.split("-", 1)
                out.update(range(int(lo), int(hi) + 1))
            else:
                out.add(int(part))
        except ValueError:
            raise ValueError(f"bad step/rank list {text!r}: expected integers and ranges like '0,2-4'") from None
    return frozenset(out)


def parse_patterns(text: str | list[str] | tuple[str, ...] | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    items = text.split(",") if isinstance(text, str) else list(text)
    items = [s.strip() for s in items if s and s.strip()]
    return tuple(items) or None


@lru_cache(maxsize=4096)
def op_aliases(op: str, overload: str) -> tuple[str, ...]:
    """Names a pattern may use for one op: 'aten::mm', 'mm', 'aten.mm.default', 'aten::mm.default'."""
    ns, _, name = op.partition("::")
    return (op, name, f"{ns}.{name}.{overload}", f"{op}.{overload}", f"{name}.{overload}")


@lru_cache(maxsize=4096)
def module_aliases(path: str) -> tuple[str, ...]:
    """A module path and all its ancestors, with and without the root's class name."""
    parts = path.split(".")
    prefixes = [".".join(parts[: i + 1]) for i in range(len(parts))]
    relative = [".".join(parts[1 : i + 1]) for i in range(1, len(parts))]
    return tuple(prefixes + relative)


@dataclass(frozen=True)
class Selector:
    ops: tuple[str, ...] | None = None  # fnmatch patterns; None = all
    exclude_ops: tuple[str, ...] | None = None
    modules: tuple[str, ...] | None = None  # an op inside a selected module (at any depth) is selected
    steps: frozenset[int] | None = None
    ranks: frozenset[int] | None = None
    phases: frozenset[str] | None = None  # forward, backward, recompute, optimizer
    _cache: dict = field(default_factory=dict, compare=False, repr=False, hash=False)

    @classmethod
    def build(cls, ops=None, exclude_ops=None, modules=None, steps=None, ranks=None, phases=None) -> "Selector":
        def ints(v):
            return parse_int_set(v) if isinstance(v, str) or v is None else frozenset(int(i) for i in v)

        return cls(parse_patterns(ops), parse_patterns(exclude_ops), parse_patterns(modules), ints(steps), ints(ranks),
                   frozenset(parse_patterns(phases)) if phases else None)

    def op_ok(self, op: str, overload: str) -> bool:
        key = (op, overload)
        hit = self._cache.get(key)
        if hit is None:
            names = op_aliases(op, overload)
            hit = self.ops is None or any(fnmatch.fnmatchcase(n, p) for p in self.ops for n in names)
            if hit and self.exclude_ops:
                hit = not any(fnmatch.fnmatchcase(n, p) for p in self.exclude_ops for n in names)
            self._cache[key] = hit
        return hit

    def module_ok(self, module: str | None) -> bool:
        if self.modules is None:
            return True
        if module is None:
            return False
        key = ("module", module)
        hit = self._cache.get(key)
        if hit is None:
            hit = any(fnmatch.fnmatchcase(n, p) for p in self.modules for n in module_aliases(module))
            self._cache[key] = hit
        return hit

    def matches(self, op: str, overload: str, module: str | None, step: int, rank: int, phase: str) -> bool:
        return (
            (self.steps is None or step in self.steps)
            and (self.ranks is None or rank in self.ranks)
            and (self.phases is None or phase in self.phases)
            and self.op_ok(op, overload)
            and self.module_ok(module)
        )

    def to_dict(self) -> dict:
        return {
            "ops": list(self.ops) if self.ops else None,
            "exclude_ops": list(self.exclude_ops) if self.exclude_ops else None,
            "modules": list(self.modules) if self.modules else None,
            "steps": sorted(self.steps) if self.steps is not None else None,
            "ranks": sorted(self.ranks) if self.ranks is not None else None,
            "phases": sorted(self.phases) if self.phases is not None else None,
        }
