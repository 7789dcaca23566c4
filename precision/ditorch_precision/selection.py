"""Which ops a tool acts on: op names, module paths, steps, ranks, phases (all optional)."""
from __future__ import annotations

import difflib
import fnmatch
from dataclasses import dataclass, field
from functools import lru_cache

PHASES = ("forward", "backward", "recompute", "optimizer")


class SelectionError(ValueError):
    """A selector pattern that matches nothing; the message names the closest existing names."""


def closest(pattern: str, names, n: int = 3) -> str:
    """'closest: a, b, c' (or a note that there is nothing to suggest)."""
    names = sorted(set(names))
    stem = pattern.replace("*", "").replace("?", "")
    hits = difflib.get_close_matches(stem, names, n=n, cutoff=0.5) or [x for x in names if stem and stem in x][:n]
    return f"closest: {', '.join(hits)}" if hits else f"{len(names)} names seen, none close"


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
def api_aliases(api: str) -> tuple[str, ...]:
    """'torch.nn.functional.linear', 'F.linear', 'linear' (and 'Tensor.view' for methods)."""
    short = api.rsplit(".", 1)[-1]
    out = [api, short]
    if api.startswith("torch.nn.functional."):
        out.append("F." + short)
    if api.startswith("torch.Tensor."):
        out.append("Tensor." + short)
    return tuple(out)


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
    apis: tuple[str, ...] | None = None  # torch-level calls ("torch.nn.functional.linear", "linear")
    _cache: dict = field(default_factory=dict, compare=False, repr=False, hash=False)

    @classmethod
    def build(cls, ops=None, exclude_ops=None, modules=None, steps=None, ranks=None, phases=None,
              apis=None) -> "Selector":
        def ints(v):
            return parse_int_set(v) if isinstance(v, str) or v is None else frozenset(int(i) for i in v)

        phase_set = frozenset(parse_patterns(phases) or ()) or None
        for phase in phase_set or ():
            if phase not in PHASES:
                raise SelectionError(f"phase {phase!r} does not exist; expected one of {', '.join(PHASES)} "
                                     f"({closest(phase, PHASES)})")
        return cls(parse_patterns(ops), parse_patterns(exclude_ops), parse_patterns(modules), ints(steps), ints(ranks),
                   phase_set, parse_patterns(apis))

    def api_ok(self, api: str | None) -> bool:
        if self.apis is None:
            return True
        return api is not None and any(fnmatch.fnmatchcase(n, p) for p in self.apis for n in api_aliases(api))

    def unmatched(self, ops_seen, modules_seen, last_step: int, apis_seen=()) -> list[str]:
        """What in this selector matched nothing the run did: one message per op or module pattern
        (with the closest names seen) and for a step set the run never reached."""
        problems = []
        for pattern in self.ops or ():
            if not any(fnmatch.fnmatchcase(n, pattern) for op in ops_seen for n in op_aliases(*op)):
                problems.append(f"op pattern {pattern!r} matched none of the {len(ops_seen)} ops the run executed "
                                f"({closest(pattern, [n for o, _ in ops_seen for n in (o, o.partition('::')[2])])})")
        for pattern in self.modules or ():
            if not any(fnmatch.fnmatchcase(n, pattern) for m in modules_seen for n in module_aliases(m)):
                names = {a for m in modules_seen for a in module_aliases(m)}
                problems.append(f"module pattern {pattern!r} matched none of the {len(modules_seen)} module paths of "
                                f"the run ({closest(pattern, names)})")
        for pattern in self.apis or ():
            if not any(fnmatch.fnmatchcase(n, pattern) for a in apis_seen for n in api_aliases(a)):
                names = {n for a in apis_seen for n in api_aliases(a)}
                problems.append(f"api pattern {pattern!r} matched none of the {len(apis_seen)} torch calls of the run "
                                f"({closest(pattern, names)})")
        if self.steps is not None and min(self.steps) > last_step:
            problems.append(f"steps {sorted(self.steps)} were never reached (the run ended at step {last_step})")
        return problems

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
            "apis": list(self.apis) if self.apis else None,
        }
