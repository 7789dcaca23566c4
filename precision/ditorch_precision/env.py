"""Switching tools on for an unmodified script: by environment variable when ``precision`` is
imported, or with ``python -m ditorch_precision.run --tool NAME script.py``.

Variables: PRECISION_TOOL (capture, autocompare, overflow_check, op_timer, dtype_cast, fallback;
comma-separated to stack), PRECISION_OUT (output directory, default ./precision_out),
PRECISION_OPS, PRECISION_EXCLUDE_OPS, PRECISION_MODULES (comma-separated fnmatch patterns),
PRECISION_STEPS, PRECISION_RANKS ('0,2-4'), PRECISION_PHASES, PRECISION_MAX_BYTES,
PRECISION_BULK=0 (capture: one file per op instead of one part file per step, the default) and
PRECISION_MODE=full|stats|checksum (capture), PRECISION_CALLSITE=1, PRECISION_API=1 (record each op's
torch-level call), PRECISION_APIS (select by torch-level call: 'torch.nn.functional.linear', 'F.linear',
'linear'), PRECISION_SYNC=0 (autocompare and overflow_check without per-op synchronisation),
PRECISION_DTYPE (dtype_cast target, default float32), PRECISION_DEVICE (fallback target /
autocompare reference device, default cpu), PRECISION_RANGE_DTYPE (overflow_check), PRECISION_TOP,
PRECISION_TOL (autocompare tolerances per dtype and op, see ditorch_precision.metrics.ToleranceTable)."""
from __future__ import annotations

import atexit
import json
import logging
import os
import sys

import torch

from .arguments import device, floating_dtype, non_negative_int, on_off, positive_int
from .autocompare import AutoCompare
from .metrics import ToleranceTable
from .capture import Capture
from .cast import DtypeCast, Fallback
from .op_timer import OpTimer
from .overflow import OverflowCheck
from .summaries import MODES
from .selection import SelectionError, Selector, closest, parse_int_set
from .tool import Tool

log = logging.getLogger("precision")

TOOLS: dict[str, type[Tool]] = {"capture": Capture, "autocompare": AutoCompare, "overflow_check": OverflowCheck,
                                "op_timer": OpTimer, "dtype_cast": DtypeCast, "fallback": Fallback}
_KEYS = ("out", "ops", "exclude_ops", "modules", "steps", "ranks", "phases", "max_bytes", "bulk", "callsite", "sync",
         "dtype", "device", "range_dtype", "top", "tol", "mode", "apis", "api")
_active: list[Tool] = []


def config_from_env(environ=os.environ) -> tuple[list[str], dict]:
    """The tools PRECISION_TOOL names and the other PRECISION_* settings; a PRECISION_* variable that is
    none of them is refused (a misspelt one would otherwise be dropped and the tool run unlike asked)."""
    known = {"PRECISION_TOOL"} | {f"PRECISION_{k.upper()}" for k in _KEYS}
    unknown = sorted(k for k in environ if k.startswith("PRECISION_") and k not in known)
    if unknown:
        raise ValueError(f"unknown variable {', '.join(unknown)} ({closest(unknown[0], known)}); "
                         f"expected {', '.join(sorted(known))}")
    names = [n.strip() for n in environ.get("PRECISION_TOOL", "").split(",") if n.strip()]
    cfg = {k: environ[f"PRECISION_{k.upper()}"] for k in _KEYS if environ.get(f"PRECISION_{k.upper()}")}
    return names, cfg


def capture_mode(text: str) -> str:
    if text not in MODES:
        raise ValueError(f"{text!r}: expected one of {', '.join(MODES)}")
    return text


# How each setting is checked (the same checks as the command line's).
CHECKS = {"max_bytes": non_negative_int, "top": positive_int, "dtype": floating_dtype, "range_dtype": floating_dtype,
          "device": device, "steps": parse_int_set, "ranks": parse_int_set, "tol": ToleranceTable.parse,
          "mode": capture_mode, "bulk": on_off, "callsite": on_off, "sync": on_off, "api": on_off}


def _checked(cfg: dict, key: str, default=None):
    """A setting's value, checked; the error names both the variable and the flag."""
    value = cfg.get(key)
    if value is None or value == "":
        return default
    try:
        return CHECKS[key](value) if key in CHECKS else value
    except ValueError as exc:
        raise ValueError(f"PRECISION_{key.upper()} / --{key.replace('_', '-')}: {exc}") from None


def make_tool(name: str, cfg: dict) -> Tool:
    """One tool from string settings (the environment's or the command line's)."""
    if name not in TOOLS:
        raise ValueError(f"PRECISION_TOOL / --tool: unknown tool {name!r}; expected one of {', '.join(TOOLS)}")
    out = cfg.get("out") or "precision_out"
    selector = Selector.build(cfg.get("ops"), cfg.get("exclude_ops"), cfg.get("modules"), _checked(cfg, "steps"),
                              _checked(cfg, "ranks"), cfg.get("phases"), cfg.get("apis"))
    common = {"with_callsite": _checked(cfg, "callsite", False), "with_api": _checked(cfg, "api", False)}
    if name == "capture":
        max_bytes = _checked(cfg, "max_bytes", 1 << 30)
        return Capture(os.path.join(out, "capture", "rank{rank}"), selector, max_bytes=max_bytes,
                       bulk=_checked(cfg, "bulk", True), mode=_checked(cfg, "mode", "full"), **common)
    if name == "autocompare":
        return AutoCompare(selector, device=str(_checked(cfg, "device", "cpu")), sync=_checked(cfg, "sync", True),
                           tolerances=_checked(cfg, "tol"),
                           save_failures=os.path.join(out, "autocompare_failures", "rank{rank}"),
                           out=os.path.join(out, "autocompare_rank{rank}.jsonl"), **common)
    if name == "overflow_check":
        return OverflowCheck(selector, range_dtype=_checked(cfg, "range_dtype"), sync=_checked(cfg, "sync", True),
                             out=os.path.join(out, "overflow_rank{rank}.json"), **common)
    if name == "op_timer":
        return OpTimer(selector, top=_checked(cfg, "top", 20), out=os.path.join(out, "op_timer_rank{rank}.json"),
                       **common)
    if name == "dtype_cast":
        return DtypeCast(selector, to=_checked(cfg, "dtype", torch.float32), **common)
    return Fallback(selector, device=str(_checked(cfg, "device", "cpu")), **common)


def start(names: list[str], cfg: dict) -> list[Tool]:
    """Enter the named tools (in order) for the rest of the process; ``stop`` or exit leaves them."""
    if _active:
        raise RuntimeError(f"precision tools already active: {[t.name for t in _active]}")
    tools = [make_tool(n, cfg) for n in names]
    for t in tools:
        t.__enter__()
        _active.append(t)
    atexit.register(_stop_at_exit)
    log.info("precision: %s active (output in %s)", ", ".join(names), cfg.get("out") or "precision_out")
    return tools


def _summary(tool: Tool) -> str | None:
    if isinstance(tool, AutoCompare):
        s = tool.summary()
        first = s["first_failure"]
        where = f"; first failure {first['op']} #{first['index']} ({first['module']})" if first else ""
        return f"autocompare: {s['n_compared']} ops compared, {s['n_failed']} failed{where}"
    if isinstance(tool, OverflowCheck):
        return f"overflow_check: {json.dumps(tool.first.to_dict()) if tool.first else 'no overflow'}"
    if isinstance(tool, OpTimer):
        return "op_timer:\n" + tool.table()
    if isinstance(tool, Capture):
        return f"capture: {tool.n_records} ops in {tool.path}"
    if isinstance(tool, (DtypeCast, Fallback)):
        return f"{tool.name}: {dict(tool.counts)}"
    return None


def stop() -> int:
    """Leave the active tools (innermost first), write their outputs and print one summary each.
    Returns 2 when a tool's selection matched nothing (the message says what), else 0."""
    status = 0
    while _active:
        tool = _active.pop()
        try:
            tool.__exit__(None, None, None)
        except SelectionError as exc:
            print(f"precision: {exc}", file=sys.stderr)
            status = 2
        except Exception as exc:  # at exit: report, never mask the script's own result
            print(f"precision: {tool.name} could not finish: {exc}", file=sys.stderr)
            continue
        line = _summary(tool)
        if line:
            print(f"precision: {line}", file=sys.stderr)
    return status


def _stop_at_exit() -> None:
    if stop():
        sys.stdout.flush(), sys.stderr.flush()
        os._exit(2)  # a selection that matched nothing must not end as a success


def activate_from_env() -> list[Tool]:
    """Start the tools PRECISION_TOOL names; a bad setting ends the process with exit status 2 and
    a message naming the variable (running the script without the asked-for tools would mislead)."""
    if not os.environ.get("PRECISION_TOOL") or _active:
        return []
    try:
        names, cfg = config_from_env()
        return start(names, cfg) if names else []
    except ValueError as exc:
        print(f"precision: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
