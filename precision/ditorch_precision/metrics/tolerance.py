"""Per-dtype tolerances: torch.testing.assert_close's defaults are the floor."""
from __future__ import annotations

import difflib
import functools
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass

import torch

# torch.testing.assert_close defaults (rtol, atol): nothing here may be looser-checked than these.
ASSERT_CLOSE_DEFAULTS: dict[torch.dtype, tuple[float, float]] = {
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
    torch.complex32: (1e-3, 1e-5),
    torch.complex64: (1.3e-6, 1e-5),
    torch.complex128: (1e-7, 1e-7),
}

# Defaults for "device result against a reference result" (another device or float64). A reduction
# of K terms legitimately differs from float64 by a few ulps times sqrt(K), so float32 gets more than
# assert_close's same-device rtol; the low-precision types are at their assert_close values.
DEVICE_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float32: (1e-5, 1e-5),
    torch.float64: (1e-7, 1e-7),
    torch.complex64: (1e-5, 1e-5),
    torch.complex128: (1e-7, 1e-7),
}


@dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def floor_tolerance(dtype: torch.dtype) -> Tolerance:
    """assert_close's default for ``dtype`` (8 ulps for dtypes it does not list, e.g. float8)."""
    if dtype in ASSERT_CLOSE_DEFAULTS:
        return Tolerance(*ASSERT_CLOSE_DEFAULTS[dtype])
    if dtype.is_floating_point:
        return Tolerance(8 * torch.finfo(dtype).eps, 1e-5)
    return Tolerance(0.0, 0.0)


def default_tolerance(dtype: torch.dtype) -> Tolerance:
    """The default for comparing a ``dtype`` device result with a reference, never below the floor."""
    floor = floor_tolerance(dtype)
    rtol, atol = DEVICE_TOLERANCES.get(dtype, (floor.rtol, floor.atol))
    return Tolerance(max(rtol, floor.rtol), max(atol, floor.atol))


def resolve_tolerance(dtype: torch.dtype, rtol: float | None = None, atol: float | None = None) -> Tolerance:
    """Explicit values win (a user may tighten); a missing one takes the dtype's default."""
    base = default_tolerance(dtype)
    return Tolerance(base.rtol if rtol is None else float(rtol), base.atol if atol is None else float(atol))


@dataclass(frozen=True)
class ToleranceRule:
    key: str  # a dtype name ("float32") or an op pattern ("aten::rsqrt", "softmax*")
    rtol: float | None
    atol: float | None


def _dtype_named(name: str) -> torch.dtype | None:
    value = getattr(torch, name.removeprefix("torch."), None)
    return value if isinstance(value, torch.dtype) else None


@dataclass(frozen=True)
class ToleranceTable:
    """Tolerances per op and per dtype, over the built-in defaults. Text form (``--tol`` and
    PRECISION_TOL): comma-separated ``KEY=RTOL[:ATOL]``, KEY a dtype name or an op pattern (fnmatch,
    'aten::mm' or 'mm'); an empty RTOL keeps the default (``mm=:1e-4`` sets only atol). An op rule
    wins over a dtype rule, which wins over ``rtol``/``atol`` (the plain --rtol/--atol)."""

    rules: tuple[ToleranceRule, ...] = ()
    rtol: float | None = None
    atol: float | None = None

    @classmethod
    def parse(cls, text: str | None, rtol: float | None = None, atol: float | None = None) -> "ToleranceTable":
        rules = []
        for item in (text or "").split(","):
            item = item.strip()
            if not item:
                continue
            key, eq, values = item.partition("=")
            parts = values.split(":")
            if not eq or not key.strip() or len(parts) > 2:
                raise ValueError(f"tolerance {item!r}: expected KEY=RTOL[:ATOL], KEY a dtype or an op pattern")
            nums = []
            for p in parts + [""] * (2 - len(parts)):
                try:
                    v = float(p) if p.strip() else None
                except ValueError:
                    raise ValueError(f"tolerance {item!r}: {p!r} is not a number") from None
                if v is not None and not (v >= 0 and v != float("inf")):
                    raise ValueError(f"tolerance {item!r}: {p!r} must be finite and >= 0")
                nums.append(v)
            rules.append(ToleranceRule(key.strip(), nums[0], nums[1]))
        return cls(tuple(rules), rtol, atol)

    def resolve(self, op: str | None, dtype: torch.dtype | None) -> tuple[float | None, float | None]:
        """(rtol, atol) for ``op`` judged in ``dtype``; None where the dtype default applies."""
        if not self.rules:
            return self.rtol, self.atol
        return _resolve(self, op, dtype)

    def _resolve(self, op: str | None, dtype: torch.dtype | None) -> tuple[float | None, float | None]:
        import fnmatch

        rtol, atol = self.rtol, self.atol
        names = (op, op.partition("::")[2]) if op else ()
        for by_op in (False, True):  # dtype rules first, op rules over them
            for r in self.rules:
                dtype_rule = _dtype_named(r.key)
                hit = (any(fnmatch.fnmatchcase(n, r.key) for n in names) if dtype_rule is None
                       else dtype_rule == dtype)
                if hit and (dtype_rule is None) == by_op:
                    rtol = r.rtol if r.rtol is not None else rtol
                    atol = r.atol if r.atol is not None else atol
        return rtol, atol

    def to_dict(self) -> dict:
        return {"rules": [asdict(r) for r in self.rules], "rtol": self.rtol, "atol": self.atol}

    def unused_keys(self, ops: Iterable[str], dtypes: Iterable[torch.dtype]) -> list[str]:
        """The keys of rules that match none of ``ops`` ('aten::mm') and none of ``dtypes``."""
        import fnmatch

        names = {n for op in ops for n in (op, op.partition("::")[2])}
        dtypes = set(dtypes)
        unused = []
        for r in self.rules:
            dtype_rule = _dtype_named(r.key)
            hit = (dtype_rule in dtypes if dtype_rule is not None
                   else any(fnmatch.fnmatchcase(n, r.key) for n in names))
            if not hit:
                unused.append(r.key)
        return unused

    def check_keys(self, ops: Iterable[str], dtypes: Iterable[torch.dtype], where: str = "the runs") -> None:
        """ValueError naming each key that matches no op or dtype of ``where`` and the closest names:
        a misspelt key ('mn=0:0') would otherwise leave the default in force and pass silently."""
        ops, dtypes = set(ops), set(dtypes)
        unused = self.unused_keys(ops, dtypes)
        if not unused:
            return
        names = sorted({n for op in ops for n in (op, op.partition("::")[2])} | {str(d)[6:] for d in dtypes})
        problems = []
        for key in unused:
            stem = key.replace("*", "").replace("?", "").removeprefix("torch.")
            hits = (difflib.get_close_matches(stem, names, n=3, cutoff=0.5)
                    or [n for n in names if stem and stem in n][:3])
            problems.append(f"tolerance key {key!r} matches no op or dtype of {where} "
                            f"({'closest: ' + ', '.join(hits) if hits else f'{len(names)} names seen, none close'})")
        raise ValueError("; ".join(problems))


@functools.lru_cache(maxsize=4096)
def _resolve(table: ToleranceTable, op: str | None, dtype: torch.dtype | None) -> tuple[float | None, float | None]:
    return table._resolve(op, dtype)


def magnitude_atol(dtype: torch.dtype, scale: float) -> float:
    """The default atol tied to the output's magnitude: min(atol, rtol x max|expected|). A fixed atol
    of 1e-5 hides a 1e-4 relative error in an output whose values are ~0.01; an honest float32
    result is within a few ulps x sqrt(K) of float64 relative to its largest value, far inside
    rtol x that value."""
    tol = default_tolerance(dtype)
    tiny = torch.finfo(dtype).tiny if dtype.is_floating_point else 0.0
    return min(tol.atol, max(tol.rtol * scale, tiny))


def op_tolerances(table: ToleranceTable, op: str, actual, expected) -> tuple[float | None, float | None]:
    """(rtol, atol) for one op's outputs: the table's, by the dtype of the first floating output;
    where the table leaves atol to the default, the magnitude-tied one (``magnitude_atol``) of the
    largest finite |expected| over the floating outputs."""
    from torch.utils._pytree import tree_leaves

    floats_a = [t for t in tree_leaves(actual) if isinstance(t, torch.Tensor) and t.dtype.is_floating_point]
    dtype = floats_a[0].dtype if floats_a else None
    rtol, atol = table.resolve(op, dtype)
    if atol is None and dtype is not None:
        scale = 0.0
        for e in tree_leaves(expected):
            if isinstance(e, torch.Tensor) and e.dtype.is_floating_point and e.numel():
                lo, hi = torch.aminmax(e.detach())  # max |e| in one pass without a copy (vector_norm(inf)
                largest = max(-float(lo), float(hi))  # and abs().amax() are several times slower here)
                if not math.isfinite(largest):
                    largest = float(e.detach().abs().nan_to_num(0.0, 0.0, 0.0).amax())
                scale = max(scale, largest)
        atol = magnitude_atol(dtype, scale)
    return rtol, atol
