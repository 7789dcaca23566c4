"""A declared mixed-precision policy: floating dtypes whose values the two runs store differently by
design (bf16 autocast, whose weights and residual stream stay float32, against a model cast to
bfloat16). Under it a tensor argument's dtype, a ``dtype`` option and a dtype's own constants
(``finfo(dtype).min`` as an attention mask's fill) that differ only by the declared dtypes are the
same argument, and the casts between them (``_to_copy``, which one run makes and the other does
not need) are not aligned: each run's casts are judged against their own float64 replay. Nothing
is waived silently: without the declaration these differences fail as changed arguments."""
from __future__ import annotations

from dataclasses import dataclass

import torch

# Ops that only change a tensor's dtype (the cast autocast inserts before a matmul, or ``.float()``)
CAST_OPS = frozenset({"aten::_to_copy", "aten::_autocast_to_reduced_precision", "aten::_autocast_to_full_precision"})
_CONSTANTS = ("min", "max", "eps", "tiny")
_FLOAT_DTYPES = {str(d).removeprefix("torch."): d for d in (torch.float64, torch.float32, torch.float16,
                                                             torch.bfloat16)}


@dataclass(frozen=True)
class MixedPrecision:
    dtypes: frozenset[str] = frozenset()  # e.g. {"float32", "bfloat16"}; empty: no policy

    @classmethod
    def parse(cls, names, where: str) -> "MixedPrecision":
        if not isinstance(names, list) or len(names) < 2 or not all(isinstance(n, str) for n in names):
            raise ValueError(f"{where}: mixed_precision {names!r}: expected a list of two or more floating dtype "
                             f"names, such as [\"float32\", \"bfloat16\"]")
        unknown = [n for n in names if n not in _FLOAT_DTYPES]
        if unknown:
            raise ValueError(f"{where}: mixed_precision names {', '.join(map(repr, unknown))}, not a floating dtype; "
                             f"expected some of {', '.join(_FLOAT_DTYPES)}")
        return cls(frozenset(names))

    def __bool__(self) -> bool:
        return bool(self.dtypes)

    def describe(self) -> str:
        return " <-> ".join(sorted(self.dtypes))

    def stats_rtol(self) -> float:
        """The tolerance of a stats capture's statistics under the policy: the coarsest declared dtype's
        default rtol. Without tensors a compare cannot replay an op on each run's own inputs, and every
        value downstream of the first cast carries that dtype's rounding in one run; 0 without a policy."""
        from .metrics import default_tolerance
        return max((default_tolerance(_FLOAT_DTYPES[n]).rtol for n in self.dtypes), default=0.0)

    def is_cast(self, rec: dict) -> bool:
        """An op of a capture record that only casts one tensor between the declared dtypes."""
        if not self.dtypes or rec.get("op") not in CAST_OPS:
            return False
        ins = [t for t in rec.get("inputs") or [] if isinstance(t, dict) and "dtype" in t]
        outs = [t for t in rec.get("outputs") or [] if isinstance(t, dict) and "dtype" in t]
        return (len(ins) == 1 and len(outs) == 1 and ins[0].get("shape") == outs[0].get("shape")
                and {ins[0]["dtype"], outs[0]["dtype"]} <= self.dtypes and ins[0]["dtype"] != outs[0]["dtype"])

    def canonical(self, value):
        """A signature value (``ditorch_precision.signature``) with the declared dtypes made one, and
        a declared dtype's constant (``finfo(d).min`` and the like) named instead of its value."""
        if not self.dtypes:
            return value
        if isinstance(value, str) and value in self.dtypes:
            return "|".join(sorted(self.dtypes))
        if isinstance(value, float):
            for d in self.dtypes:
                fi = torch.finfo(_FLOAT_DTYPES[d])
                for name in _CONSTANTS:
                    if value == float(getattr(fi, name)):
                        return f"finfo.{name}"
                    if value == -float(getattr(fi, name)):
                        return f"-finfo.{name}"
            return value
        if isinstance(value, list):
            return [self.canonical(v) for v in value]
        if isinstance(value, dict):
            return {k: self.canonical(v) for k, v in value.items()}
        return value
