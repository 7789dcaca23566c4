"""What a model holds when a capture first sees it run: its parameters and buffers, recorded once per
root module before its first op (a module record ``STATE_OP``), and a compare's judgement of the two
runs' records.

Two aligned runs start from the same weights, buffers and data; every op of a compare is judged
from each run's own inputs and regions against the drift their inputs carry, so a difference in
what no op made (a weight loaded differently, a buffer computed from another config value such as
``rope_theta``) passes every op and every region while both runs compute correctly from it. The
state record compares those tensors directly and exactly: a difference is a failure of its own,
ranked before the module's first op. Runs that trained before the capture carry their weights'
honest drift: there a difference is reported as drift (the optimizer had state at the capture's
first step, or the record was taken after an optimizer step inside the capture)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .metrics import compare_tensors
from .metrics.verdict import tensor_leaves
from .summaries import stats_difference

STATE_OP = "module::state"  # a module record: a root module's parameters and buffers before its first op
INPUT_OP = "module::input"  # a module record: the data (integer and boolean tensors) a root module was called with
OPS = (STATE_OP, INPUT_OP)
# meta.json: {"roots": [{"module", "step", "names"}], "inputs": {module: names}, "trained_before": bool | None,
# "first_step": int}
META_KEY = "model_state"
_MAX_NAMES = 1 << 20  # a meta.json is data: a list past this is refused, not walked


def state_of(module: torch.nn.Module) -> tuple[list[str], list[torch.Tensor]]:
    """The module's parameters, then its buffers (every buffer, persistent or not), by name; a tensor
    shared under two names is listed once. Plain tensors with data only: a tensor subclass (a sharded
    DTensor) or a tensor on the meta device is left out."""
    names, tensors, seen = [], [], set()
    for prefix, items in (("", module.named_parameters()), ("buffer:", module.named_buffers())):
        for name, t in items:
            if t is None or id(t) in seen or type(t) not in (torch.Tensor, torch.nn.Parameter) or t.is_meta:
                continue
            seen.add(id(t))
            names.append(prefix + name)
            tensors.append(t)
    return names, tensors


def data_inputs(args: tuple, kwargs: dict) -> tuple[list[str], list[torch.Tensor]]:
    """The integer and boolean tensors a module was called with, by position or keyword: data (token
    ids, labels, masks), which no training drifts. Floating inputs are left out: a pipeline stage's
    input is an activation that drifts honestly."""
    names, tensors = [], []
    for name, t in [(f"args[{k}]", a) for k, a in enumerate(args)] + [(k, v) for k, v in (kwargs or {}).items()]:
        if (isinstance(t, torch.Tensor) and type(t) is torch.Tensor and not t.is_meta
                and not (t.is_floating_point() or t.is_complex())):
            names.append(name)
            tensors.append(t)
    return names, tensors


def optimizer_had_state(optimizer: Any) -> bool:
    """Whether the optimizer stepped before (it keeps state per parameter from its first step)."""
    state = getattr(optimizer, "state", None)
    if not state:
        return False
    for group in getattr(optimizer, "param_groups", ()):
        for p in group.get("params", ()):
            if state.get(p):
                return True
    return False


@dataclass(frozen=True)
class RunState:
    """What a capture's meta.json says of its model state records, checked as data."""

    roots: list[dict]  # [{"module", "step", "names"}] in call order
    inputs: dict[str, list[str]]  # root module -> the names of its data inputs
    trained_before: bool | None  # an optimizer held state at the capture's first step
    first_step: int | None

    def names(self, module: str | None, k: int) -> list[str]:
        """The names of the k-th state record of ``module`` (records and roots are in call order)."""
        same = [r for r in self.roots if r["module"] == module]
        return same[k]["names"] if k < len(same) else []


def _names_ok(v: Any) -> bool:
    return isinstance(v, list) and len(v) <= _MAX_NAMES and all(isinstance(n, str) for n in v)


def read_meta(meta: dict) -> RunState | None:
    """The state records' description in a capture's meta.json; None when it has none (a capture of an
    earlier version). Malformed entries are dropped (a meta.json is data, not trusted)."""
    entry = meta.get(META_KEY)
    if not isinstance(entry, dict):
        return None
    roots, inputs = entry.get("roots"), entry.get("inputs")
    roots = roots if isinstance(roots, list) and len(roots) <= _MAX_NAMES else []
    good = [r for r in roots if isinstance(r, dict) and isinstance(r.get("module"), str) and _names_ok(r.get("names"))]
    names = {k: v for k, v in inputs.items() if isinstance(k, str) and _names_ok(v)} if isinstance(inputs, dict) else {}
    trained, first = entry.get("trained_before"), entry.get("first_step")
    return RunState(good, names, trained if isinstance(trained, bool) else None,
                    first if isinstance(first, int) and not isinstance(first, bool) else None)


def _tensor_difference(x: torch.Tensor, y: torch.Tensor) -> str | None:
    """None when equal element for element (NaN where both are NaN); else how they differ."""
    verdict = compare_tensors(x, y, exact=True)
    if verdict.passed:
        return None
    if not (x.is_floating_point() and verdict.stats is not None):
        return verdict.detail
    return f"{verdict.detail}, max_abs {verdict.stats.max_abs:.3g}, max_rel {verdict.stats.max_rel:.3g}"


def _summary_difference(sa: Any, sb: Any) -> str | None:
    """One tensor's statistics (stats mode) or hash (checksum mode) in the two runs: None when they
    agree. The statistics of equal tensors agree to the bit on one device; across devices (a GPU's
    reduction against the CPU's fused pass) the sums may differ in their last bits: within 1e-12."""
    if isinstance(sa, dict) and isinstance(sb, dict):
        return stats_difference(sa, sb, 1e-12)
    return None if sa == sb else "their checksums differ"


def _pairs(names_a: list[str], names_b: list[str], n_a: int,
           n_b: int) -> tuple[list[tuple[str, int, int | None]], int]:
    """(name, position in A, position in B or None) for each of A's tensors, and how many of B's have no
    partner: by name where both runs named every tensor (a model that lists its parameters in another
    order, or has one more), else by position."""
    if len(names_a) == n_a and len(names_b) == n_b:
        where = {name: k for k, name in enumerate(names_b)}
        return [(name, k, where.get(name)) for k, name in enumerate(names_a)], len(set(names_b) - set(names_a))
    pairs = [(names_a[k] if k < len(names_a) else f"tensor {k}", k, k if k < n_b else None) for k in range(n_a)]
    return pairs, max(n_b - n_a, 0)


# the rule, what a record holds, and what a difference in it means
_STATE_WORDS = ("state", "parameters and buffers the module held before its first op",
                "the runs do not start from the same weights, buffers or data (a checkpoint loaded differently, "
                "another initialisation, a buffer computed from another config value)")
_INPUT_WORDS = ("data", "data tensors the module was called with",
                "the runs were fed different data (another order, sampling, sharding or tokenisation)")


def judge(ra: dict, rb: dict, da: dict | None, db: dict | None, names: tuple[list[str], list[str]],
          drift_why: str | None) -> tuple[str, str, str]:
    """(status, rule, detail) for a pair of state (rule ``state``) or data (rule ``data``) records.
    ``da``/``db``: the records' loaded tensors (full captures), else their statistics or checksums are
    compared. ``names``: each run's names of its record's tensors. ``drift_why``: why a difference may
    be honest drift (the runs trained before), or None: then a difference fails."""
    rule, what, whose = _INPUT_WORDS if ra.get("op") == INPUT_OP else _STATE_WORDS
    if da is not None and db is not None:
        la, lb = tensor_leaves(da["outputs"]), tensor_leaves(db["outputs"])
        meta_a = [{"shape": list(t.shape), "dtype": t.dtype} for t in la]
        meta_b = [{"shape": list(t.shape), "dtype": t.dtype} for t in lb]
        differ = _tensor_difference
    else:
        key = "stats" if ra.get("stats") is not None else "checksums"
        la, lb = ra.get(key), rb.get(key)
        if not isinstance(la, list) or not isinstance(lb, list):
            return "skipped", "skipped", f"no tensors, statistics or checksums saved for the {what}"
        meta_a, meta_b = ra.get("outputs") or [], rb.get("outputs") or []
        differ = _summary_difference
    pairs, not_compared = _pairs(names[0], names[1], len(la), len(lb))
    differing, compared = [], 0
    for name, ka, kb in pairs:
        ma = meta_a[ka] if ka < len(meta_a) and isinstance(meta_a[ka], dict) else {}
        mb = meta_b[kb] if kb is not None and kb < len(meta_b) and isinstance(meta_b[kb], dict) else None
        if mb is None or (ma.get("shape"), ma.get("dtype")) != (mb.get("shape"), mb.get("dtype")):
            not_compared += 1
            continue
        compared += 1
        if (why := differ(la[ka], lb[kb])) is not None:
            differing.append((name, why))
    skipped = (f"; {not_compared} not compared (in one run only, or of another dtype or shape in the reference)"
               if not_compared else "")
    if not differing:
        return "pass", rule, f"the {compared} {what} are equal{skipped}"
    shown = "; ".join(f"{name}: {why}" for name, why in differing[:4])
    more = f"; and {len(differing) - 4} more" if len(differing) > 4 else ""
    detail = f"{len(differing)} of the {compared} {what} differ from the reference's: {shown}{more}{skipped}"
    if drift_why is not None:
        return "drift", rule, f"{detail} ({drift_why})"
    return "fail", rule, f"{detail}: {whose}"
