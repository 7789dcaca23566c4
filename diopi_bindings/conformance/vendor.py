"""A vendor's skip and tolerance file (YAML or JSON; data only, never code).

    skip:
      "aten::gelu": "erf not available in firmware 1.2"       # every case of an op
      "aten::mm[bfloat16]": "accumulates in bf16 by design"   # one dtype of it
    tolerance:
      "aten::_softmax": {rtol: 1.0e-4, atol: 1.0e-5}
      "aten::mm[bfloat16]": {rtol: 3.0e-2}

Keys name operators of the schema, optionally with ``[dtype]``; the most specific entry wins.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from diopi_bindings.schema import BY_NAME

_KEY = re.compile(r"^(?P<op>[^\[\]]+)(\[(?P<dtype>[a-z0-9]+)\])?$")


class VendorFileError(ValueError):
    """The vendor file is unreadable or names something that does not exist."""


@dataclass
class VendorFile:
    skip: dict[str, str] = field(default_factory=dict)
    tolerance: dict[str, dict[str, float]] = field(default_factory=dict)

    def skip_reason(self, op: str, dtype: str) -> str | None:
        return self.skip.get(f"{op}[{dtype}]", self.skip.get(op))

    def tolerance_for(self, op: str, dtype: str) -> dict[str, float]:
        return {**self.tolerance.get(op, {}), **self.tolerance.get(f"{op}[{dtype}]", {})}


def _check_key(key: object, where: str, path: str) -> str:
    match = _KEY.match(key) if isinstance(key, str) else None
    if match is None:
        raise VendorFileError(f"{path}: {where} key {key!r} is not 'aten::op' or 'aten::op[dtype]'")
    op, dtype = match["op"], match["dtype"]
    if op not in BY_NAME:
        raise VendorFileError(f"{path}: {where} names {op!r}, which is not a DIOPI operator")
    if dtype is not None and dtype not in BY_NAME[op].dtypes:
        raise VendorFileError(f"{path}: {where} names dtype {dtype!r}, which {op} does not declare "
                              f"(it declares {', '.join(BY_NAME[op].dtypes)})")
    return key


def load_vendor_file(path: str | Path) -> VendorFile:
    path = str(path)
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise VendorFileError(f"cannot read vendor file {path}: {exc.strerror}") from None
    try:
        data = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise VendorFileError(f"{path} is not valid {'JSON' if path.endswith('.json') else 'YAML'}: {exc}") from None
    data = data or {}
    if not isinstance(data, dict) or set(data) - {"skip", "tolerance"}:
        raise VendorFileError(f"{path}: expected a mapping with the keys 'skip' and/or 'tolerance'")
    skip, tolerance = data.get("skip") or {}, data.get("tolerance") or {}
    if not isinstance(skip, dict) or not isinstance(tolerance, dict):
        raise VendorFileError(f"{path}: 'skip' and 'tolerance' must be mappings keyed by operator")
    out = VendorFile()
    for key, reason in skip.items():
        out.skip[_check_key(key, "skip", path)] = str(reason)
    for key, tol in tolerance.items():
        _check_key(key, "tolerance", path)
        if not isinstance(tol, dict) or not tol or set(tol) - {"rtol", "atol"}:
            raise VendorFileError(f"{path}: tolerance for {key} must be a mapping with rtol and/or atol")
        try:
            values = {k: float(v) for k, v in tol.items()}
        except (TypeError, ValueError):
            raise VendorFileError(f"{path}: tolerance for {key} must be numbers, got {tol}") from None
        if any(v < 0 for v in values.values()):
            raise VendorFileError(f"{path}: tolerance for {key} must not be negative")
        out.tolerance[key] = values
    return out
