"""Switching tools on for an unmodified script: by environment variable when ``precision`` is
imported, or with ``python -m precision.run --tool NAME script.py``.

Variables: PRECISION_TOOL (capture, autocompare, overflow_check, op_timer, dtype_cast, fallback;
comma-separated to stack), PRECISION_OUT (output directory, default ./precision_out),
PRECISION_OPS, PRECISION_EXCLUDE_OPS, PRECISION_MODULES (comma-separated fnmatch patterns),
PRECISION_STEPS, PRECISION_RANKS ('0,2-4'), PRECISION_PHASES, PRECISION_MAX_BYTES and PRECISION_BULK=1 (capture),
PRECISION_CALLSITE=1, PRECISION_SYNC=0 (autocompare and overflow_check without per-op synchronisation),
PRECISION_DTYPE (dtype_cast target, default float32), PRECISION_DEVICE (fallback target /
autocompare reference device, default cpu), PRECISION_RANGE_DTYPE (overflow_check), PRECISION_TOP."""
from __future__ import annotations

import atexit
import json
import logging
import os
import sys

import torch

from .autocompare import AutoCompare
from .capture import Capture
from .cast import DtypeCast, Fallback
from .op_timer import OpTimer
from .overflow import OverflowCheck
from .selection import Selector
from .tool import Tool

log = logging.getLogger("precision")

TOOLS: dict[str, type[Tool]] = {"capture": Capture, "autocompare": AutoCompare, "overflow_check": OverflowCheck,
                                "op_timer": OpTimer, "dtype_cast": DtypeCast, "fallback": Fallback}
_KEYS = ("out", "ops", "exclude_ops", "modules", "steps", "ranks", "phases", "max_bytes", "bulk", "callsite", "sync",
         "dtype", "device", "range_dtype", "top")
_active: list[Tool] = []


def config_from_env(environ=os.environ) -> tuple[list[str], dict]:
    names = [n.strip() for n in environ.get("PRECISION_TOOL", "").split(",") if n.strip()]
    cfg = {k: environ[f"PRECISION_{k.upper()}"] for k in _KEYS if environ.get(f"PRECISION_{k.upper()}")}
    return names, cfg


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, str(name).removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"{name!r} is not a torch dtype (e.g. float32, float16)")
    return dtype


def _flag(value) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def make_tool(name: str, cfg: dict) -> Tool:
    """One tool from string settings (the environment's or the command line's)."""
    if name not in TOOLS:
        raise ValueError(f"unknown precision tool {name!r}; expected one of {', '.join(TOOLS)}")
    out = cfg.get("out") or "precision_out"
    selector = Selector.build(cfg.get("ops"), cfg.get("exclude_ops"), cfg.get("modules"), cfg.get("steps"),
                              cfg.get("ranks"), cfg.get("phases"))
    common = {"with_callsite": _flag(cfg.get("callsite", "0"))}
    if name == "capture":
        max_bytes = int(float(cfg["max_bytes"])) if cfg.get("max_bytes") else 1 << 30
        return Capture(os.path.join(out, "capture", "rank{rank}"), selector, max_bytes=max_bytes,
                       bulk=_flag(cfg.get("bulk", "0")), **common)
    if name == "autocompare":
        return AutoCompare(selector, device=cfg.get("device") or "cpu", sync=_flag(cfg.get("sync", "1")),
                           out=os.path.join(out, "autocompare_rank{rank}.jsonl"), **common)
    if name == "overflow_check":
        rd = _dtype(cfg["range_dtype"]) if cfg.get("range_dtype") else None
        return OverflowCheck(selector, range_dtype=rd, sync=_flag(cfg.get("sync", "1")),
                             out=os.path.join(out, "overflow_rank{rank}.json"), **common)
    if name == "op_timer":
        return OpTimer(selector, top=int(cfg.get("top") or 20), out=os.path.join(out, "op_timer_rank{rank}.json"),
                       **common)
    if name == "dtype_cast":
        return DtypeCast(selector, to=_dtype(cfg.get("dtype") or "float32"), **common)
    return Fallback(selector, device=cfg.get("device") or "cpu", **common)


def start(names: list[str], cfg: dict) -> list[Tool]:
    """Enter the named tools (in order) for the rest of the process; ``stop`` or exit leaves them."""
    if _active:
        raise RuntimeError(f"precision tools already active: {[t.name for t in _active]}")
    tools = [make_tool(n, cfg) for n in names]
    for t in tools:
        t.__enter__()
        _active.append(t)
    atexit.register(stop)
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


def stop() -> None:
    """Leave the active tools (innermost first), write their outputs and print one summary each."""
    while _active:
        tool = _active.pop()
        try:
            tool.__exit__(None, None, None)
        except Exception as exc:  # at exit: report, never mask the script's own result
            print(f"precision: {tool.name} could not finish: {exc}", file=sys.stderr)
            continue
        line = _summary(tool)
        if line:
            print(f"precision: {line}", file=sys.stderr)


def activate_from_env() -> list[Tool]:
    names, cfg = config_from_env()
    return start(names, cfg) if names and not _active else []
