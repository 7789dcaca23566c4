"""The loss-curve check of the H2 paper: MRE = (1/n) sum |(y_i - y^_i) / y_i| over the common
steps, y the reference run's loss; a run passes below the threshold (1.5%)."""
from __future__ import annotations

import csv
import io
import json
import math
import os
from dataclasses import asdict, dataclass, field
from typing import Iterable, Mapping

DEFAULT_THRESHOLD = 0.015


class LossInputError(ValueError):
    """A loss file or curve that cannot be used; the message names the file and what is wrong."""

    nan_steps: list[int] = []


@dataclass
class LossReport:
    mre: float
    max_rel: float
    n: int
    passed: bool
    threshold: float
    first_divergence_step: int | None  # first step whose relative error exceeds the threshold
    warmup: int = 0
    steps: list[int] = field(default_factory=list)
    rel: list[float] = field(default_factory=list)  # per-step relative error, signed (y^ - y) / y
    run: list[float] = field(default_factory=list)
    ref: list[float] = field(default_factory=list)
    run_path: str | None = None
    ref_path: str | None = None

    def to_dict(self, curves: bool = False) -> dict:
        d = asdict(self)
        if not curves:
            for k in ("steps", "rel", "run", "ref"):
                d.pop(k)
        return d


Curve = Mapping[int, float]


def _number(value, what: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise LossInputError(f"{what}: {value!r} is not a number") from None


def _step(value, what: str) -> int:
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise LossInputError(f"{what}: step {value!r} is not an integer") from None
    if not f.is_integer():
        raise LossInputError(f"{what}: step {value!r} is not an integer")
    return int(f)


def _add(curve: dict[int, float], step: int, loss: float, where: str) -> None:
    if step in curve:
        raise LossInputError(f"{where}: step {step} appears twice")
    curve[step] = loss


def parse_loss_text(text: str, name: str = "<text>") -> dict[int, float]:
    """JSON lines ({"step": 1, "loss": 2.31}) or CSV with 'step' and 'loss' columns."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise LossInputError(f"{name}: empty; expected JSON lines {{\"step\": 1, \"loss\": 2.31}} or CSV step,loss")
    curve: dict[int, float] = {}
    if lines[0].lstrip().startswith("{"):
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            where = f"{name}:{lineno}"
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise LossInputError(f"{where}: not JSON ({exc.msg}); expected {{\"step\": N, \"loss\": X}}") from None
            if not isinstance(rec, dict) or "step" not in rec or "loss" not in rec:
                raise LossInputError(f"{where}: expected an object with 'step' and 'loss', got {line.strip()[:80]!r}")
            _add(curve, _step(rec["step"], where), _number(rec["loss"], where), where)
        return curve
    reader = csv.DictReader(io.StringIO(text))
    fields = [f.strip() for f in (reader.fieldnames or [])]
    if "step" not in fields or "loss" not in fields:
        raise LossInputError(f"{name}: CSV header {fields} lacks 'step' and 'loss' columns (or the file is neither "
                             "JSON lines nor CSV)")
    reader.fieldnames = fields
    for lineno, row in enumerate(reader, 2):
        where = f"{name}:{lineno}"
        if row.get("loss") is None:
            raise LossInputError(f"{where}: missing 'loss' value")
        _add(curve, _step(row["step"], where), _number(row["loss"].strip(), where), where)
    if not curve:
        raise LossInputError(f"{name}: header only, no loss values")
    return curve


def read_loss_file(path: str) -> dict[int, float]:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise LossInputError(f"{path}: cannot read ({exc.__class__.__name__}: {exc})") from None
    return parse_loss_text(text, path)


def write_loss_file(path: str, losses: Iterable[float] | Curve, start: int = 1) -> None:
    """JSON lines, one {"step", "loss"} per line (steps from ``start`` when given a plain list)."""
    items = losses.items() if isinstance(losses, Mapping) else enumerate(losses, start)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        for step, loss in items:
            f.write(json.dumps({"step": int(step), "loss": float(loss)}) + "\n")


def _as_curve(x, name: str) -> tuple[dict[int, float], str | None]:
    if isinstance(x, (str, os.PathLike)):
        return read_loss_file(os.fspath(x)), os.fspath(x)
    if isinstance(x, Mapping):
        return {int(k): float(v) for k, v in x.items()}, None
    return {i: float(v) for i, v in enumerate(x, 1)}, None


def loss_check(run, ref, threshold: float = DEFAULT_THRESHOLD, warmup: int = 0,
               common_steps: bool = False) -> LossReport:
    """Compare a run's loss curve with the reference's. ``run``/``ref``: a file path, a
    {step: loss} mapping or a list (steps 1..n). The steps must match unless ``common_steps``;
    the first ``warmup`` common steps are left out. Raises LossInputError for unusable inputs."""
    a, run_path = _as_curve(run, "run")
    b, ref_path = _as_curve(ref, "ref")
    name_a, name_b = run_path or "run", ref_path or "ref"
    for curve, name in ((a, name_a), (b, name_b)):
        if not curve:
            raise LossInputError(f"{name}: no loss values")
    if set(a) != set(b) and not common_steps:
        only_a, only_b = sorted(set(a) - set(b)), sorted(set(b) - set(a))
        raise LossInputError(f"step ranges differ: {name_a} has steps {min(a)}..{max(a)} ({len(a)}), {name_b} has "
                             f"{min(b)}..{max(b)} ({len(b)}); only in {name_a}: {only_a[:10]}, only in {name_b}: "
                             f"{only_b[:10]} (use common_steps / --common-steps to compare the overlap)")
    steps = sorted(set(a) & set(b))
    if not steps:
        raise LossInputError(f"{name_a} and {name_b} have no step in common")
    if warmup < 0 or warmup >= len(steps):
        raise LossInputError(f"warmup {warmup} leaves no steps out of {len(steps)} common steps")
    steps = steps[warmup:]
    bad = [s for s in steps if not (math.isfinite(a[s]) and math.isfinite(b[s]))]
    if bad:
        err = LossInputError(f"non-finite loss (NaN/Inf) at steps {bad[:10]}{' ...' if len(bad) > 10 else ''} "
                             f"(in {name_a}: {[s for s in bad if not math.isfinite(a[s])][:10]}, in {name_b}: "
                             f"{[s for s in bad if not math.isfinite(b[s])][:10]})")
        err.nan_steps = bad
        raise err
    zero = [s for s in steps if b[s] == 0.0]
    if zero:
        raise LossInputError(f"{name_b}: reference loss is 0 at steps {zero[:10]}: the relative error is undefined")
    rel = [(a[s] - b[s]) / b[s] for s in steps]
    mre = math.fsum(abs(r) for r in rel) / len(rel)
    first = next((s for s, r in zip(steps, rel) if abs(r) > threshold), None)
    return LossReport(mre=mre, max_rel=max(abs(r) for r in rel), n=len(steps), passed=mre < threshold,
                      threshold=threshold, first_divergence_step=first, warmup=warmup, steps=steps, rel=rel,
                      run=[a[s] for s in steps], ref=[b[s] for s in steps], run_path=run_path, ref_path=ref_path)
