"""Reading YAML/JSON spec files and typed field access with errors that name file and field."""
from __future__ import annotations

import builtins
import json
import math
import re
from pathlib import Path
from typing import Any, Mapping

from .errors import SpecError


class _Mapping(dict[str, Any]):
    """A parsed mapping that remembers the keys its file gave more than once (the parsers keep the last
    value silently); Fields rejects them, naming the dotted path."""

    duplicates: list[str]


def _mapping(pairs: list[tuple[Any, Any]]) -> _Mapping:
    out = _Mapping()
    out.duplicates = []
    for k, v in pairs:
        if k in out and k not in out.duplicates:
            out.duplicates.append(k)
        out[k] = v
    return out


def _kind(v: Any) -> str:
    """What a parsed value is, in the file's terms (not the parser's class names: "_Mapping", "NoneType")."""
    if isinstance(v, dict):
        return "a mapping"
    if isinstance(v, list):
        return "a list"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, bool):
        return "true or false"
    if isinstance(v, (int, float)):
        return "a number"
    return "null" if v is None else type(v).__name__


def _yaml_loader() -> Any:
    import yaml

    # a SafeLoader of its own, so the constructor below does not change yaml.safe_load for everyone
    loader_class: Any = type("Loader", (yaml.SafeLoader,), {})

    def construct(loader: Any, node: Any) -> _Mapping:
        loader.flatten_mapping(node)
        return _mapping([(loader.construct_object(k, deep=True), loader.construct_object(v, deep=True))
                         for k, v in node.value])

    loader_class.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct)
    return loader_class


def load_mapping(path: str | Path) -> dict[str, Any]:
    """Load a YAML (.yaml/.yml) or JSON file whose top level is a mapping. A key given twice in one
    mapping is an error (when its mapping is read through Fields), not the last value silently."""
    p = Path(path)
    if not p.is_file():
        raise SpecError(str(path), "<file>", "file not found", "an existing YAML or JSON file")
    text = p.read_text()
    try:
        if p.suffix in (".yaml", ".yml"):
            try:
                import yaml
            except ImportError as e:  # PyYAML is optional; JSON always works
                raise SpecError(
                    str(path), "<file>", "PyYAML is not installed", "a .json file or `pip install pyyaml`"
                ) from e
            data = yaml.load(text, Loader=_yaml_loader())  # noqa: S506 (a SafeLoader subclass)
        else:
            data = json.loads(text, object_pairs_hook=_mapping)
    except SpecError:
        raise
    except Exception as e:  # parse errors from either parser
        raise SpecError(str(path), "<file>", f"cannot parse: {e}", "valid YAML or JSON") from e
    if not isinstance(data, dict):
        raise SpecError(str(path), "<top level>", f"got {_kind(data)}", "a mapping")
    return data


_DURATION = re.compile(r"^\s*([0-9.eE+-]+)\s*(s|ms|us)?\s*$")
_DURATION_SCALE: dict[str | None, float] = {None: 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6}
_BW = re.compile(r"^\s*([0-9.eE+-]+)\s*(GB/s|GBps|Gbps|Gb/s|MB/s|Mbps)?\s*$")
_BW_SCALE: dict[str | None, float] = {
    None: 1.0,
    "GB/s": 1.0,
    "GBps": 1.0,
    "Gbps": 1 / 8,
    "Gb/s": 1 / 8,
    "MB/s": 1e-3,
    "Mbps": 1e-3 / 8,
}


class Fields:
    """Typed access to one mapping of a spec file; every error names source and dotted field path."""

    def __init__(self, data: Mapping[str, Any], source: str, prefix: str = "") -> None:
        self.data, self.source, self.prefix = data, source, prefix
        for key in getattr(data, "duplicates", None) or ():
            raise self.err(key, f"given twice in one mapping (the file's last value {data[key]!r} would win "
                           "silently)", "each key once")

    def path(self, key: str) -> str:
        return f"{self.prefix}{key}"

    def err(self, key: str, problem: str, expected: str = "") -> SpecError:
        return SpecError(self.source, self.path(key), problem, expected)

    def _get(self, key: str, default: Any, required: bool) -> Any:
        if key not in self.data or self.data[key] is None:
            if required:
                raise self.err(key, "missing", "a value")
            return default
        return self.data[key]

    def int(self, key: str, default: int | None = None, *, required: bool = True, min: int | None = 1,
            max: int | None = None) -> int:
        v = self._get(key, default, required and default is None)
        if isinstance(v, bool) or not isinstance(v, int):
            if isinstance(v, float) and math.isfinite(v) and v.is_integer():
                v = int(v)
            else:
                raise self.err(key, f"got {v!r}", "an integer")
        if min is not None and v < min:
            raise self.err(key, f"got {v}", f"an integer >= {min}")
        if max is not None and v > max:
            raise self.err(key, f"got {v}", f"an integer <= {max}")
        return v

    def _range(self, key: str, v: float, shown: Any, lo: float | None, hi: float | None, what: str) -> float:
        """Finite and within [lo, hi]: infinities and absurd magnitudes would turn into 0-second or
        infinite costs downstream instead of an error here."""
        if not math.isfinite(v):
            raise self.err(key, f"got {shown!r}", f"a finite {what}")
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            bounds = [f">= {lo:g}"] * (lo is not None) + [f"<= {hi:g}"] * (hi is not None)
            raise self.err(key, f"got {shown!r}", f"a {what} " + " and ".join(bounds))
        return v

    def float(self, key: str, default: float | None = None, *, required: bool = True, positive: bool = True,
              lo: float | None = None, hi: float | None = None) -> float:
        v = self._get(key, default, required and default is None)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise self.err(key, f"got {v!r}", "a number")
        if positive and not v > 0:
            raise self.err(key, f"got {v}", "a positive number")
        return self._range(key, float(v), v, lo, hi, "number")

    def _with_unit(self, key: builtins.str, v: Any, pattern: re.Pattern[builtins.str],
                   scale: dict[builtins.str | None, builtins.float], expected: builtins.str) -> builtins.float:
        """A number, or a string of a number and one of `scale`'s units."""
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
        m = pattern.match(str(v))
        try:  # the pattern's number class also admits '1.2.3' or '--'
            number = float(m.group(1)) if m else None
        except ValueError:
            number = None
        if m is None or number is None:
            raise self.err(key, f"got {v!r}", expected)
        return number * scale[m.group(2)]

    def bandwidth(self, key: builtins.str, default: builtins.float | None = None, *, required: builtins.bool = True,
                  lo: builtins.float | None = None, hi: builtins.float | None = None) -> builtins.float:
        """A bandwidth in GB/s; strings may carry a unit: '200Gbps', '9.56 GB/s'."""
        v = self._get(key, default, required and default is None)
        val = self._with_unit(key, v, _BW, _BW_SCALE, "a number in GB/s or a string like '200Gbps' or '25 GB/s'")
        if not val > 0:
            raise self.err(key, f"got {v!r}", "a positive bandwidth")
        return self._range(key, val, v, lo, hi, "bandwidth in GB/s")

    def duration(self, key: builtins.str, default: builtins.float = 0.0, hi: builtins.float = 3600.0) -> builtins.float:
        """A time in seconds, >= 0; strings may carry a unit: '1ms', '50 us', '0.2 s'."""
        v = self._get(key, default, False)
        val = self._with_unit(key, v, _DURATION, _DURATION_SCALE, "seconds, or a string like '1ms' or '50us'")
        if not val >= 0:
            raise self.err(key, f"got {v!r}", "a duration >= 0")
        return self._range(key, val, v, 0.0, hi, "duration in seconds")

    def str(self, key: builtins.str, default: builtins.str | None = None, *, required: builtins.bool = True,
            choices: tuple[builtins.str, ...] | None = None) -> builtins.str:
        v = self._get(key, default, required and default is None)
        if not isinstance(v, str):
            raise self.err(key, f"got {v!r}", "a string")
        if choices and v not in choices:
            raise self.err(key, f"got {v!r}", "one of " + ", ".join(choices))
        return v

    def bool(self, key: builtins.str, default: builtins.bool) -> builtins.bool:
        v = self._get(key, default, False)
        if not isinstance(v, bool):
            raise self.err(key, f"got {v!r}", "true or false")
        return v

    def sub(self, key: builtins.str, *, required: builtins.bool = True) -> "Fields":
        v = self._get(key, {}, required)
        if not isinstance(v, dict):
            raise self.err(key, f"got {_kind(v)}", "a mapping")
        return Fields(v, self.source, f"{self.path(key)}.")

    def list(self, key: builtins.str, *, required: builtins.bool = True) -> builtins.list[Any]:
        v = self._get(key, [], required)
        if not isinstance(v, list):
            raise self.err(key, f"got {_kind(v)}", "a list")
        return v

    def unknown(self, allowed: set[builtins.str]) -> None:
        """Reject misspelt keys instead of silently ignoring them."""
        extra = sorted(set(self.data) - allowed)
        if extra:
            raise self.err(extra[0], "unknown field", "one of " + ", ".join(sorted(allowed)))
