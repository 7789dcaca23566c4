"""Align two captures op by op (a device run against a reference run) and find the first op
whose outputs differ beyond tolerance."""
from __future__ import annotations

import functools
import math
import os
import re
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

import torch

from .align import PARAMS_OP, Alignment, Equivalences, align, group_key, region_module_records
from . import model_state
from .collectives import PLUMBING, check_across_ranks, is_collective, stats_from_capture
from .dump import NUMBERED_ALIKE_SINCE, Dump, DumpError, check_replayable, unwritten_masks
from .optimizer_replay import FILE as OPTIMIZER_STEPS
from .optimizer_replay import NotReplayable, StepReader, inputs_record, option_differences, replay, why_not
from .metrics import (DEFAULT_RATIO_K, ToleranceTable, TreeVerdict, compare_error_ratio, compare_trees,
                      compare_trees_ratio, op_tolerances, tensor_leaves)
from .opinfo import op_info
from torch.utils._pytree import tree_leaves
from .records import resolve_op
from .point_to_point import load_transfers
from .random_contracts import contract_verdict, stats_contract_verdict
from .summaries import (compare_summaries, difference_estimate, note_reduction_scales, outputs_in_common, same_numbers,
                        stats_difference, stats_rtol, summaries_apart, tensor_checksum)
from .reference import run_reference, skip_reason, without_randomness
from .shards import TPShards
from .signature import differences, signature

_ID_FIELDS = ("index", "op", "overload", "api", "phase", "module", "step", "rank")


# A streamed report (``on_row``) keeps only this many failing rows and failed or unjudged regions:
# the first divergence is among them, the counts cover all.
KEPT_WHEN_STREAMED = 1000


@dataclass
class DiffReport:
    dump_a: str
    dump_b: str
    ops: list[dict] = field(default_factory=list)  # one record per op, in call order
    unmatched: list[dict] = field(default_factory=list)  # ops of one run that the other has no match for
    regions: list[dict] = field(default_factory=list)  # modules whose op sequences differ, judged as modules
    # Streaming (see compare_dumps): each row goes to on_row(kind, row), kind "op", "unmatched" or
    # "region"; the lists above then keep only failures (KEPT_WHEN_STREAMED of each).
    on_row: Callable[[str, dict], None] | None = None
    counts: Counter = field(default_factory=Counter)  # "op:<status>", "unmatched", "region:<verdict>"
    notes: list[str] = field(default_factory=list)  # what the reader must know before the numbers

    def add(self, ops: list[dict], unmatched: Sequence[dict] = (), regions: Sequence[dict] = ()) -> None:
        """Rows of a part of the run, in call order (each part after the ones before it)."""
        self.counts.update(f"op:{r['status']}" for r in ops)
        self.counts["unmatched"] += len(unmatched)
        self.counts.update(f"region:{r['verdict']}" for r in regions)
        if self.on_row is None:
            self.ops.extend(ops)
            self.unmatched.extend(unmatched)
            self.regions.extend(regions)
            return
        for kind, rows in (("op", ops), ("unmatched", unmatched), ("region", regions)):
            for r in rows:
                self.on_row(kind, r)
        room = KEPT_WHEN_STREAMED - len(self.ops)
        self.ops.extend([r for r in ops if r["status"] == "fail"][:max(room, 0)])
        room = KEPT_WHEN_STREAMED - len(self.regions)
        self.regions.extend([r for r in regions if r["verdict"] in ("fail", "unjudged")][:max(room, 0)])

    @property
    def failed(self) -> list[dict]:
        return [r for r in self.ops if r["status"] == "fail"]

    @property
    def first_divergence(self) -> dict | None:
        return self.failed[0] if self.failed else None

    @property
    def unjudged(self) -> list[dict]:
        """Regions nothing could judge: they must not pass."""
        return [r for r in self.regions if r["verdict"] == "unjudged"]

    @property
    def passed(self) -> bool:
        return not self.counts["op:fail"] and not self.counts["region:unjudged"]

    def to_dict(self) -> dict:
        c = self.counts
        return {"dump_a": self.dump_a, "dump_b": self.dump_b, "passed": self.passed,
                "n_ops": sum(n for k, n in c.items() if k.startswith("op:")),
                "n_passed": c["op:pass"], "n_failed": c["op:fail"], "n_skipped": c["op:skipped"],
                "n_drift": c["op:drift"], "n_unmatched": c["unmatched"],
                "n_unjudged_regions": c["region:unjudged"], "first_divergence": self.first_divergence,
                "notes": self.notes, "streamed": self.on_row is not None, "ops": self.ops, "unmatched": self.unmatched,
                "regions": self.regions}


def _row(rec: dict, status: str, rule: str, detail: str, verdict: TreeVerdict | None = None) -> dict:
    row = {k: rec.get(k) for k in _ID_FIELDS}
    row.update(status=status, rule=rule, detail=detail)
    if verdict is not None:
        summary = verdict.summary()
        summary.pop("passed"), summary.pop("rule"), summary.pop("detail")
        row.update(summary)
    return row


RULES = ("auto", "allclose", "error_ratio")


@dataclass(frozen=True)
class CompareOptions:
    """How ops are judged. ``rule``: "error_ratio" replays each op in float64 on the CPU from both
    runs' own inputs (so drift inherited from earlier ops is not blamed on later ones); "allclose"
    compares the runs' outputs directly; "auto" (default) uses the error ratio wherever an op can
    be replayed (known op, not random, inputs saved) and allclose elsewhere."""

    rule: str = "auto"
    ratio_k: float = DEFAULT_RATIO_K
    tolerances: ToleranceTable = ToleranceTable()
    align: str = "structure"  # or "index"
    equivalences: Equivalences = field(default_factory=Equivalences)
    # A run of one TP group against a run of one rank: module records gathered across A's ranks
    shards: TPShards | None = None

    @functools.cached_property
    def least_stats_rtol(self) -> float:
        """A stats capture's least tolerance: under a mixed-precision policy values carry the coarser dtype's
        rounding, compounded op after op, so K (ratio_k) of them; 0 without a policy."""
        return self.ratio_k * self.equivalences.mixed_precision.stats_rtol()


def _replay_func(ra: dict, da: dict, db: dict):
    """The op to replay in float64, or the reason it cannot be."""
    try:
        func = resolve_op(ra["op"], ra.get("overload") or "default")
    except LookupError:
        return None, f"op {ra['op']} unknown to this torch: no float64 replay"
    reason = skip_reason(func)
    if reason == "random op" and all(without_randomness(func, d["args"], d["kwargs"]) for d in (da, db)):
        reason = None
    if reason:
        return None, reason
    try:
        check_replayable((da["args"], da["kwargs"], db["args"], db["kwargs"]), f"op {ra['op']} #{ra['index']}")
    except ValueError as exc:
        return None, str(exc)
    return func, None


def _contract_row(ra: dict, da: dict) -> dict | None:
    """A random op of A judged by its contract on its own inputs and draws; None if it has none."""
    verdict = contract_verdict(resolve_op(ra["op"], ra.get("overload") or "default"), da["args"], da["kwargs"],
                               da["outputs"])
    return None if verdict is None else _row(ra, verdict[0], "random_contract", verdict[1])


def _random_op(rec: dict, data: dict | None) -> bool:
    """Whether a record is of an op that drew random numbers (a seeded-random op not called with a
    zero ``dropout_p``); for an op this torch does not know, or without saved arguments, as the
    capture marked it (a capture without the mark: any seeded-random op)."""
    if rec.get("kind", "op") != "op":
        return False
    try:
        func = resolve_op(rec["op"], rec.get("overload") or "default")
    except LookupError:
        return rec.get("random") is True
    if skip_reason(func) != "random op":
        return False
    if data is None:
        return rec.get("random") is not False
    return not without_randomness(func, data["args"], data["kwargs"])


def _draws(rec: dict, data) -> list:
    """What a random op drew: ``native_dropout``'s mask (its output also carries the input), else
    its tensor outputs; of loaded tensors (``data``), or of a checksum or stats capture's list of
    hashes or statistics."""
    outs = list(data) if isinstance(data, list) else tensor_leaves(data["outputs"]) if data else []
    return outs[1:2] if rec["op"] == "aten::native_dropout" and len(outs) == 2 else outs


def _same_bytes(xs: list[torch.Tensor], ys: list[torch.Tensor]) -> bool:
    """Byte for byte the same tensors (NaN payloads included), by the checksum captures' own hash."""
    return len(xs) == len(ys) and all(x.dtype == y.dtype and x.shape == y.shape and
                                      tensor_checksum(x) == tensor_checksum(y) for x, y in zip(xs, ys))


def compare_records(a: Dump, b: Dump, ra: dict, rb: dict, opts: CompareOptions, arguments: bool = True) -> dict:
    """One op of run A (the device) against the same op of run B (the reference). A random op's
    row says whether A drew the same numbers as B (``same_draws``, byte for byte): where it did,
    the draws are no point after which the runs may differ. ``arguments``: its arguments are
    compared too (not for ops paired inside a region, whose neighbours differ by design)."""
    if is_collective(ra["op"]):
        return _row(ra, "skipped", "skipped", "collective: judged across ranks (compare the runs' rank directories)")
    da, db = a.load(ra), b.load(rb)
    if opts.shards is not None and ra.get("kind") == "module" and da is not None and db is not None:
        da = {**da, "outputs": opts.shards.gather(ra, tensor_leaves(da["outputs"]), tensor_leaves(db["outputs"]))}
    elif opts.shards is not None and ra.get("kind") == "module" and da is None and "stats" in ra:
        ra = opts.shards.gather_stats(ra, rb)
    row = _judge(a, b, ra, rb, da, db, opts, in_region=not arguments)
    changed = argument_differences(ra, rb, da, db, opts.equivalences) if arguments else []
    if changed:  # the cause comes first; the outputs' statistics stay in the row
        row.update(status="fail", rule="arguments", detail="; ".join(changed)
                   + (f" (outputs: {row['rule']}: {row['detail']})" if row["status"] in ("pass", "fail") else ""))
    if da is not None and db is not None and not (ra.get("unwritten") or rb.get("unwritten")):
        drift = relative_difference(da["outputs"], db["outputs"])
        if drift is not None:
            row["drift"] = drift
    if _random_op(ra, da) or _random_op(rb, db):  # each by its own op's arguments (variants differ)
        if da is not None and db is not None:
            same = _same_bytes(_draws(ra, da), _draws(rb, db))
        elif "checksums" in ra and "checksums" in rb:  # a checksum capture: the draws' hashes
            hashes = [r.get("checksums") for r in (ra, rb)]
            same = all(isinstance(h, list) and h for h in hashes) and _draws(ra, hashes[0]) == _draws(rb, hashes[1])
        else:  # a stats capture: the draws' statistics the very same numbers (a float64 sum and sum of
            # squares, extremes and counts: other draws give other sums), not a byte-for-byte proof
            found = [r.get("stats") for r in (ra, rb)]
            same = all(isinstance(f, list) and f for f in found) and _draws(ra, found[0]) == _draws(rb, found[1])
            if not same and found[0] and row["rule"] == "stats":  # judged by its contract instead (an
                row = _stats_contract_row(ra, row)  # argument that differs stays the failure)
        row["same_draws"] = ra["op"] == rb["op"] and same
    return row


def _stats_contract_row(ra: dict, row: dict) -> dict:
    """A random op of a stats capture whose draws are other numbers than the reference's, judged by what
    its draws' statistics must satisfy (stats_contract_verdict), or skipped where they say nothing."""
    verdict = stats_contract_verdict(ra["op"], ra.get("signature"), ra.get("stats"))
    if verdict is None:
        return row | _row(ra, "skipped", "skipped", "its draws are other numbers than B's, and its statistics "
                                                    "cannot be judged by its contract")
    return row | _row(ra, verdict[0], "random_contract", f"{verdict[1]} (from the draws' statistics)")


def relative_difference(out_a, out_b) -> float | None:
    """How far apart the runs' results are, as one number: the largest over the floating tensors
    both have (shape for shape) of ||a - b|| / ||b|| (float64, over elements finite in both); None
    when there is no such tensor. The drift an op's result carries, whatever its cause."""
    worst = None
    for x, y in zip(tensor_leaves(out_a), tensor_leaves(out_b)):
        if x.shape != y.shape or not (x.is_floating_point() and y.is_floating_point()) or not x.numel():
            continue
        x, y = x.detach().to("cpu", torch.float64), y.detach().to("cpu", torch.float64)
        finite = torch.isfinite(x) & torch.isfinite(y)
        if not bool(finite.all()):
            x, y = x[finite], y[finite]
        ref = float(torch.linalg.vector_norm(y))
        diff = float(torch.linalg.vector_norm(x - y))
        value = diff / ref if ref > 0 else (0.0 if diff == 0 else math.inf)
        worst = value if worst is None else max(worst, value)
    return worst


def _signature(rec: dict, data: dict | None) -> dict | None:
    if data is not None:
        return signature(rec["op"], rec.get("overload"), data["args"], data["kwargs"])
    return rec.get("signature")  # written into the index by stats and checksum captures


def argument_differences(ra: dict, rb: dict, da: dict | None, db: dict | None, eq: Equivalences) -> list[str]:
    """How the two calls' arguments differ (non-tensor values; shapes and dtypes of tensors): a
    config value or a scale factor that differs changes no input tensor, so no replay sees it.
    Equivalent kernels (other ops) are compared on the arguments both have; the table's
    ``ignore_arguments`` names benign ones."""
    out = []
    if ra.get("reduce_op") != rb.get("reduce_op"):
        out.append(f"argument reduce_op: {ra.get('reduce_op')!r} in A, {rb.get('reduce_op')!r} in B")
    sa, sb = _signature(ra, da), _signature(rb, db)
    if sa is None or sb is None:
        return out
    ignored = eq.ignored_arguments.get(ra["op"], frozenset()) | eq.ignored_arguments.get(rb["op"], frozenset())
    if eq.mixed_precision:  # the declared dtypes (and their finfo constants) are one
        sa, sb = eq.mixed_precision.canonical(sa), eq.mixed_precision.canonical(sb)
    if ra["op"] != rb["op"]:  # other schemas: a name both have is the same option only for plain values
        sa, sb = ({k: v for k, v in s.items() if not _holds_tensors(v)} for s in (sa, sb))
    return out + differences(sa, sb, only_shared=ra["op"] != rb["op"], ignored=ignored)


def _holds_tensors(value) -> bool:
    if isinstance(value, list):
        return any(_holds_tensors(v) for v in value)
    return isinstance(value, dict) and "shape" in value


def _judge(a: Dump, b: Dump, ra: dict, rb: dict, da: dict | None, db: dict | None, opts: CompareOptions,
           in_region: bool = False) -> dict:
    if da is None or db is None:
        summary = compare_summaries(ra, rb, opts.least_stats_rtol)
        if summary is not None:  # stats or checksum captures
            if in_region and summary[0] == "fail":
                # paired inside a region: called with other inputs by design (sdpa's math path scales q
                # and k where eager scales the scores), and without tensors there is no replay from each
                # run's own inputs, so its summaries cannot tell a fault: the region's module records judge
                return _row(ra, "skipped", "skipped", "inside a region whose op sequences differ, its inputs differ by "
                            f"design and a {summary[1]} capture cannot replay it ({summary[2]}): judged by the "
                            "region's module records")
            return _row(ra, *summary)
        return _row(ra, "skipped", "skipped", "tensors not saved in " + ("A" if da is None else "B"))
    out_a, out_b = da["outputs"], db["outputs"]
    if ra.get("kind") == "module":
        # A module may return extra outputs in one run (attention weights in eager attention, None
        # with a fused kernel): its outputs are compared as far as both have them, shape for shape.
        func, why_not = None, "module record"
        la, lb = tensor_leaves(out_a), tensor_leaves(out_b)
        n = outputs_in_common([x.shape for x in la], [y.shape for y in lb])
        out_a, out_b = la[:n], lb[:n]
    elif ra["op"] != rb["op"]:
        # equivalent kernels (ditorch_precision.align): their results (first outputs) are compared directly
        func, why_not = None, f"{ra['op']} and {rb['op']} are equivalent ops"
        out_a, out_b = tensor_leaves(out_a)[:1], tensor_leaves(out_b)[:1]
    elif opts.rule == "allclose":
        func, why_not = None, ""
    else:
        func, why_not = _replay_func(ra, da, db)
    if why_not == "random op" and (row := _contract_row(ra, da)) is not None:
        return row  # judged on A's own draws: the reference's draws are other numbers
    unwritten = _unwritten_outputs(ra, rb, da, db, a, b)
    if isinstance(unwritten, str):
        return _row(ra, "skipped", "skipped", unwritten)
    plain_op = ra.get("kind", "op") == "op" and ra["op"] == rb["op"]
    if func is None and (why_not == "uninitialised output" or (opts.rule == "error_ratio" and plain_op)):
        return _row(ra, "skipped", "skipped", why_not)
    if func is not None:
        fa = run_reference(func, da["args"], da["kwargs"])
        fb = run_reference(func, db["args"], db["kwargs"])
        if unwritten:
            out_a, out_b, fa, fb = (_zero(t, unwritten) for t in (out_a, out_b, fa, fb))
        # an integer result (an index, a count, DDP's bucket assignment) is judged against its own
        # replay where the runs' inputs differ (drift, or a setting's effect) or inside a region (its
        # arguments differ by design: a TP rank's vocabulary range): else it equals B's
        own = any(not t.is_floating_point() for t in tensor_leaves(out_a)) and (in_region or not _same_inputs(da, db))
        verdict = compare_trees_ratio(out_a, out_b, fa, k=opts.ratio_k, reference_fp64=fb, integers_from_replay=own)
    else:
        if unwritten:
            out_a, out_b = _zero(out_a, unwritten), _zero(out_b, unwritten)
        rtol, atol = op_tolerances(opts.tolerances, ra["op"], out_a, out_b)
        verdict = compare_trees(out_a, out_b, rtol=rtol, atol=atol)
        if (not verdict.passed and verdict.verdicts and ra.get("kind", "op") == "op" and opts.rule != "allclose"
                and (why := _within_input_drift(da, db, out_a, out_b))):
            return _row(ra, "pass", "input_drift", f"{why}; elementwise: {verdict.deciding.detail}", verdict)
    if not verdict.verdicts:
        return _row(ra, "skipped", "skipped", verdict.detail or "no tensor outputs")
    deciding = verdict.deciding
    return _row(ra, "pass" if verdict.passed else "fail", verdict.rule, deciding.detail if deciding else "", verdict)


def _within_input_drift(da: dict, db: dict, out_a, out_b) -> str | None:
    """Why an op compared directly (it cannot be replayed: another device's kernel, an equivalent one)
    passes although outside the elementwise tolerance: the runs called it with inputs already apart
    (drift from earlier ops) and its result is no further apart than DRIFT_GROWTH x that, the largest
    ||a - b|| / ||b|| of its floating inputs (paired in order, shape for shape); None when not."""
    carried = relative_difference((da["args"], da["kwargs"]), (db["args"], db["kwargs"]))
    own = relative_difference(out_a, out_b)
    if not carried or not math.isfinite(carried) or own is None or own > DRIFT_GROWTH * carried:
        return None
    return (f"||a - b|| / ||b|| = {own:.3g} within {DRIFT_GROWTH:g} x the {carried:.3g} its inputs carry "
            "(not replayable: judged against its inputs' drift)")


def _same_inputs(da: dict, db: dict) -> bool:
    """Whether the runs called the op with the same tensors, bit for bit (NaNs where each has them)."""
    xs, ys = (tensor_leaves((d["args"], d["kwargs"])) for d in (da, db))
    return len(xs) == len(ys) and all(x.shape == y.shape and x.dtype == y.dtype and _same_bytes([x], [y])
                                      for x, y in zip(xs, ys))


def _unwritten_outputs(ra: dict, rb: dict, da: dict, db: dict, a: Dump, b: Dump) -> dict[int, torch.Tensor] | str:
    """Output elements no op wrote since an ``empty*`` in either run ({k: mask}, compared as 0 on
    both sides), or why the op cannot be judged: a kernel (not a view) that read such elements
    computed from the allocator's leftovers. An argument the op writes is not read (``copy_``)."""
    if not (ra.get("unwritten") or rb.get("unwritten")) or ra.get("kind", "op") != "op":
        return {}
    masks: dict[int, torch.Tensor] = {}
    for rec, data, dump in ((ra, da, a), (rb, db, b)):
        what = f"{dump.path}: op {rec['op']} #{rec['index']}"
        for k, m in unwritten_masks(data, "outputs", what).items():
            masks[k] = masks[k] | m if k in masks and masks[k].shape == m.shape else m
        read = unwritten_masks(data, "inputs", what)
        try:
            info = op_info(resolve_op(rec["op"], rec.get("overload") or "default"))
        except LookupError:
            info = None
        if read and info is not None and not info.is_view:
            written = {name for _, name in info.written}
            schema = resolve_op(rec["op"], rec.get("overload") or "default")._schema
            k = 0
            for i, arg in enumerate(schema.arguments):
                value = data["args"][i] if i < len(data["args"]) else data["kwargs"].get(arg.name)
                n = sum(isinstance(t, torch.Tensor) for t in tree_leaves(value))
                if arg.name not in written and any(j in read for j in range(k, k + n)):
                    count = sum(int(read[j].sum()) for j in range(k, k + n) if j in read)
                    return (f"reads {count} elements of {arg.name} that no op wrote since an empty* allocated them "
                            f"(in run {'A' if rec is ra else 'B'}): its result holds the allocator's leftovers")
                k += n
    return masks


def _zero(tree, masks: dict[int, torch.Tensor]):
    """The tensors of ``tree`` with the masked elements of the k-th set to 0 (copies)."""
    leaves = [t for t in tree_leaves(tree) if isinstance(t, torch.Tensor)]
    return [t.masked_fill(masks[k].to(t.device), 0) if k in masks and masks[k].shape == t.shape else t
            for k, t in enumerate(leaves)]


def compare_dumps(dump_a: str, dump_b: str, *, rtol: float | None = None, atol: float | None = None,
                  ratio_k: float | None = None, options: CompareOptions | None = None,
                  on_row: Callable[[str, dict], None] | None = None) -> DiffReport:
    """Compare capture A (device) against capture B (reference), aligned by structure (see
    ditorch_precision.align; ``options.align="index"``: by call index, as both runs must then run the same ops).

    ``options`` (default: the auto rule); the older keywords still work: ``ratio_k`` asks for the
    error-ratio rule with that k, ``rtol``/``atol`` for allclose with those tolerances.

    The captures' index records are read a step at a time (where each capture's steps follow one
    another, as a training loop writes them; else whole). ``on_row(kind, row)``: every row is handed
    over as its step is judged ("op", "unmatched" or "region") and the report keeps only the
    counts and the failures, so memory does not grow with the number of ops."""
    if options is None:
        if ratio_k is not None:
            options = CompareOptions("error_ratio", ratio_k, ToleranceTable(rtol=rtol, atol=atol))
        elif rtol is not None or atol is not None:
            options = CompareOptions("allclose", tolerances=ToleranceTable(rtol=rtol, atol=atol))
        else:
            options = CompareOptions()
    a, b = Dump.open(dump_a), Dump.open(dump_b)
    check_tolerance_keys(options.tolerances, a, b)
    notes = [n for n in (numbering_differs(a, b, options.align), hooks_differ(a, b, options.align)) if n]
    report = DiffReport(dump_a, dump_b, on_row=on_row, notes=notes)
    with torch.no_grad():
        if options.align == "index":
            _compare_by_index(a, b, options, report)
        else:
            _compare_by_structure(a, b, options, report)
    return report


def _version(d: Dump) -> int:
    v = d.meta.get("version")
    return v if isinstance(v, int) and not isinstance(v, bool) else 0  # meta.json is data: none or junk is old


def numbering_differs(a: Dump, b: Dump, align: str) -> str | None:
    """One capture was made before both op hooks numbered the same ops (format version
    NUMBERED_ALIKE_SINCE), the other since: their op sequences differ by the ops only one rule
    numbers, so those are unmatched or, aligned by index, every later op is misaligned."""
    va, vb = _version(a), _version(b)
    if (va >= NUMBERED_ALIKE_SINCE) == (vb >= NUMBERED_ALIKE_SINCE):
        return None
    effect = ("call indices differ, so ops are misaligned" if align == "index" else
              "the ops only one of them numbers are unmatched: counted, not judged")
    return (f"the captures were made by precision versions that number ops differently (format version A: {va}, "
            f"B: {vb}; since version {NUMBERED_ALIKE_SINCE} neither hook numbers the detach torch asks a dispatch "
            "mode for, nor the inner ops of a _foreach_* slow path, a custom op or a factory); their op sequences "
            f"differ and {effect}. Take both captures with the same version for an exact match")


def hooks_differ(a: Dump, b: Dump, align: str) -> str | None:
    """The captures were recorded through different op hooks (meta.json "hook"; a capture made
    before the C++ hook existed has none and went through the Python dispatch mode). Since format
    version NUMBERED_ALIKE_SINCE both number the same ops, and only the ops a mode makes torch run
    out of place differ (unmatched, or an alignment failure by index); before, the ops the dispatch
    mode itself causes were numbered too (unmatched, or every later op misaligned by index)."""
    hook_a, hook_b = (str(d.meta.get("hook", "python")) for d in (a, b))
    if hook_a == hook_b:
        return None
    if min(_version(a), _version(b)) >= NUMBERED_ALIKE_SINCE:  # both hooks number the same ops
        effect = ("an alignment failure" if align == "index" else "unmatched: counted, not judged")
        differs = ("both hooks number the same ops, but where a dispatch mode makes torch run an op out of place "
                   f"(add for the program's add_: sdpa's mask, some gradient sums) the op at that number differs: "
                   f"{effect}")
    else:
        effect = ("call indices differ, so ops are misaligned" if align == "index" else
                  "the ops only one hook records are unmatched: counted, not judged")
        differs = f"their op sequences differ and {effect}"
    return (f"the captures were recorded through different op hooks (A: {hook_a!r}, B: {hook_b!r}); {differs}. "
            "Capture both with the same hook (Capture(hook=...)) for an exact match")


def check_tolerance_keys(table: ToleranceTable, *dumps: Dump) -> None:
    """ValueError for a tolerance key that matches no op and no output dtype of the captures."""
    if not table.rules:
        return
    ops, dtypes = set(), set()
    for dump in dumps:
        ops |= dump.ops
        dtypes |= {d for d in map(lambda name: getattr(torch, name, None), dump.dtypes) if isinstance(d, torch.dtype)}
    table.check_keys(ops, dtypes, where="the captures")


def _compare_by_index(a: Dump, b: Dump, options: CompareOptions, report: DiffReport) -> None:
    ia, ib = a.by_index(), b.by_index()
    rows: list[dict] = []
    for index in sorted(set(ia) | set(ib)):
        ra, rb = ia.get(index), ib.get(index)
        if ra is None or rb is None:
            present = ra or rb
            where = "A" if ra is None else "B"
            rows.append(_row(present, "fail", "alignment", f"op #{index} {present['op']} missing in {where}"))
            continue
        if ra["op"] != rb["op"] or ra.get("overload") != rb.get("overload"):
            rows.append(_row(ra, "fail", "alignment", f"op {ra['op']} in A but {rb['op']} in B at index "
                             f"{ra['index']}: the runs took different paths"))
            continue
        rows.append(compare_records(a, b, ra, rb, options))
    state = _States.of(a, b)
    if state is not None:  # what the runs start from and are fed: paired per module and step, as by structure
        mods = [[r for r in d.records if r.get("kind") == "module" and r["op"] in model_state.OPS] for d in (a, b)]
        rows.extend(state.row(a, b, ra, rb) for ra, rb in align(*mods).module_pairs)
        rows.sort(key=lambda r: r["index"])
    report.add(rows)


def self_check(a: Dump, ra: dict, opts: CompareOptions) -> dict:
    """An op of A that B has no match for, judged against its own float64 replay (autocompare's
    rule): drift inherited from earlier ops cannot fail it, so it is judged wherever it runs. A
    random op's draws have nothing to be compared with (``same_draws`` false)."""
    da = a.load(ra)
    row = _self_judge(ra, da, opts)
    if _random_op(ra, da):
        row["same_draws"] = False
    return row


def _self_judge(ra: dict, da: dict | None, opts: CompareOptions) -> dict:
    if da is None:
        return _row(ra, "skipped", "skipped", "tensors not saved in A")
    func, why_not = _replay_func(ra, da, da)
    if why_not == "random op" and (row := _contract_row(ra, da)) is not None:
        return row
    if func is None:
        return _row(ra, "skipped", "skipped", why_not)
    if op_info(func).is_view:
        return _row(ra, "skipped", "skipped", "view: runs no kernel")
    expected = run_reference(func, da["args"], da["kwargs"])
    rtol, atol = op_tolerances(opts.tolerances, ra["op"], da["outputs"], expected)
    verdict = compare_trees(da["outputs"], expected, rtol=rtol, atol=atol)
    if not verdict.verdicts:
        return _row(ra, "skipped", "skipped", verdict.detail or "no tensor outputs")
    deciding = verdict.deciding
    detail = "against its own float64 replay: " + (deciding.detail if deciding else "")
    return _row(ra, "pass" if verdict.passed else "fail", verdict.rule, detail, verdict)


def _reordered_summaries(rows: list[dict], own_a: list[dict], own_b: list[dict], opts: CompareOptions) -> None:
    """A stats or checksum capture cannot replay a region's unmatched ops: those of A that B ran too, in
    another order (DDP's copies of gradients into and out of its buckets, rebuilt in another layout),
    are judged against the first of B's unmatched ops of the region with the same name, overload and
    output shapes whose summaries agree, each of B's taken once (in a tensor-parallel compare, a slice's
    with every rank's slices joined: the vocabulary-parallel embedding's gradient). ``rows``: self_check's rows of
    ``own_a``, updated in place; an op no partner of B agrees with stays as it was (unjudged)."""
    left = list(own_b)
    for row, ra in zip(rows, own_a):
        if row["status"] != "skipped" or not ("stats" in ra or "checksums" in ra):
            continue
        for k, rb in enumerate(left):
            if (rb["op"], rb.get("overload")) != (ra["op"], ra.get("overload")):
                continue
            # a tensor-parallel rank's slice: every rank's slices joined (shards.TPShards)
            joined = ra if opts.shards is None else opts.shards.gather_stats(ra, rb)
            if _shapes_of(rb) != _shapes_of(ra) and joined is ra:
                continue
            summary = compare_summaries(joined, rb, opts.least_stats_rtol)
            if summary is not None and summary[0] == "pass":
                how = "run in another order" if joined is ra else "its ranks' slices joined"
                row.update(status="pass", rule=summary[1], detail=f"{how}: as B's #{rb['index']} ({summary[2]})")
                del left[k]
                break


class _Draws:
    """Where a run draws random numbers: the (step, phase, module) of each of its random ops, found on
    first use (most steps never ask)."""

    def __init__(self, records: list[dict]):
        self.records, self._keys = records, None

    def near(self, region: tuple) -> bool:
        """Whether the run draws in ``region``'s step and phase, in its module, one inside it, or one around
        it (a fused kernel's draws and a composite's need not be in the same module)."""
        if self._keys is None:
            self._keys = {group_key(r) for r in self.records if _random_op(r, None)}
        step, phase, module = region
        return any(s == step and p == phase and _nested(m, module) for s, p, m in self._keys)


def _nested(m: str | None, n: str | None) -> bool:
    if m is None or n is None:
        return m == n
    return m == n or m.startswith(n + ".") or n.startswith(m + ".")


def _one_sided_draws(rows: list[dict], region: tuple, drawn_b: _Draws) -> None:
    """A region's random ops of A where B draws nothing (its step and phase, the module or one nested with
    it): a dropout or a sampling that runs in one run only is a divergence, not randomness the runs make
    differently, which would excuse every difference after it. ``rows``: the region's self_check rows,
    updated in place."""
    drew = [r for r in rows if _drew(r)]
    if not drew or drawn_b.near(region):
        return
    step, phase, module = region
    for r in drew:
        r.update(status="fail", rule="random_draws", same_draws=None,
                 detail=f"draws random numbers where the reference draws none ({module or 'no module'}, {phase}, "
                        f"step {step}): a dropout or a sampling that runs in one run only; its own check: "
                        f"{r['detail']}")


# ops that hand on their input's values (copies and casts): an insertion of one is no divergence where a
# stats capture cannot compare the values
HANDS_ON = frozenset({"aten::clone", "aten::contiguous", "aten::copy_", "aten::_to_copy", "aten::to", "aten::detach",
                      "aten::alias", "aten::lift_fresh", "aten::lift_fresh_copy", "aten::_copy_from",
                      "aten::_copy_from_and_resize", "aten::reshape", "aten::flatten"})


def _inserted_ops(rows: list[dict], own_a: list[dict], a: Dump) -> None:
    """A region where B runs none of its own ops and no module record judges: A's ops there are insertions
    into the reference's computation, and each must hand on what it was given (a copy, a cast, a change of
    layout). One whose output is none of its inputs (a loss scaled by 0.5, gradients clipped in one run
    only) is a divergence: every later op replays exactly from its own inputs, and outside a region the
    runs are not compared directly, so nothing else would see it. ``rows``: the region's self_check rows
    of ``own_a``, updated in place; an op without tensor inputs (a factory) or outputs, or whose tensors
    are not at hand, is left as it is."""
    for row, ra in zip(rows, own_a):
        if row["status"] == "fail":
            continue
        changed = _changed_values(ra, a)
        if changed is not None:
            row.update(status="fail", rule="inserted_op",
                       detail=f"runs in A only, where the reference runs nothing ({ra.get('module') or 'no module'}, "
                              f"{ra.get('phase')}, step {ra.get('step')}), and changes the values it is given: "
                              f"{changed}")


def _reference_insertions(own_b: list[dict], b: Dump) -> dict:
    """A region where only B runs ops of its own and no module record judges: one row, a pass where each
    of B's ops hands on what it was given (DDP without ``gradient_as_bucket_view`` copies each gradient out
    of its bucket, which with it is a view of the bucket), a failure naming the first that does not (the
    run under test skips a computation the reference makes)."""
    for rb in own_b:
        changed = _changed_values(rb, b)
        if changed is not None:
            return _row(rb, "fail", "inserted_op", f"runs in B only (the reference), where A runs nothing "
                        f"({rb.get('module') or 'no module'}, {rb.get('phase')}, step {rb.get('step')}), and "
                        f"changes the values it is given: {changed}") | {"run": "B"}
    first = own_b[0]
    return _row(first, "pass", "inserted_op", f"{len(own_b)} ops in B only (the reference), where A runs nothing, "
                "each handing on what it was given (copies, casts, changes of layout)") | {"run": "B"}


def _moves_values(ra: dict) -> bool:
    """Whether an op is known by its name to compute nothing: a view, a copy or a cast (HANDS_ON)."""
    if ra["op"] in HANDS_ON:
        return True
    try:
        return op_info(resolve_op(ra["op"], ra.get("overload") or "default")).is_view
    except LookupError:
        return False


def _changed_values(ra: dict, a: Dump) -> str | None:
    """How an op's outputs differ from its inputs (None where each output is one of its inputs, or where
    that cannot be told): of its tensors when saved, else of a stats capture's statistics."""
    if ra.get("kind", "op") != "op" or is_collective(ra["op"]):
        return None
    try:
        if op_info(resolve_op(ra["op"], ra.get("overload") or "default")).is_view:
            return None  # a view computes nothing
    except LookupError:
        return None  # an op this torch does not know: nothing to tell by
    da = a.load(ra)
    what = ra["op"] + _scalar_args(ra, da)
    if da is None:  # a stats capture: by the statistics of a reduction's input, else by the op
        outs, ins = ra.get("stats") or [], ra.get("input_stats")
        if outs and isinstance(ins, dict) and isinstance(outs[0], dict):
            same = (same_numbers(outs[0]) or (None,))[1:] == (same_numbers(ins) or (None,))[1:]
            return None if same else f"{what}: its output's statistics are not its input's"
        tensors_in = any(isinstance(v, dict) and "shape" in v or isinstance(v, list) and v and isinstance(v[0], dict)
                         for v in (ra.get("signature") or {}).values())
        if ra["op"] in HANDS_ON or not tensors_in or not ra.get("stats"):
            return None
        return f"{what} computes new values (a stats capture holds no tensors to show they are its inputs')"
    ins = tensor_leaves((da["args"], da["kwargs"]))
    outs = [t for t in tensor_leaves(da["outputs"]) if t.is_floating_point()]
    if not ins or not outs or len(ins) * len(outs) > 4096:
        return None
    for k, out in enumerate(outs):
        if not any(_hands_on(out, t) for t in ins):
            return f"{what}: output {k} ({list(out.shape)}) is none of its inputs"
    return None


def _scalar_args(ra: dict, da: dict | None) -> str:
    """An op's number arguments, as a note: from its signature, else from its saved arguments."""
    def numbers(values) -> list:
        return [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    found = numbers((ra.get("signature") or {}).values())
    if not found and da is not None:
        found = numbers(tree_leaves((da["args"], da["kwargs"])))
    return f" (arguments {', '.join(map(repr, found))})" if found else ""


def _hands_on(out: torch.Tensor, inp: torch.Tensor) -> bool:
    """Whether ``out`` holds ``inp``'s values, in ``out``'s dtype (a copy, a cast, a change of layout)."""
    if out.numel() != inp.numel() or inp.is_complex() != out.is_complex():
        return False
    x, y = out.detach().reshape(-1), inp.detach().to(out.dtype).reshape(-1)
    return bool(torch.equal(x, y) or (x.isnan() == y.isnan()).all() and torch.equal(x.nan_to_num(0), y.nan_to_num(0)))


def _shapes_of(rec: dict) -> list:
    return [o.get("shape") for o in rec.get("outputs") or [] if isinstance(o, dict)]


def _drew(row: dict) -> bool:
    """An op of A whose draws may differ from the reference's: a random op not known to have drawn
    the same numbers (no partner, tensors not saved, or other bytes)."""
    return row.get("same_draws") is False


def _region_verdict(rows: list[dict]) -> tuple[str, str]:
    """A region's verdict from its rows: fail, drift (module records differ only after an earlier
    divergence, so the difference may be inherited), pass, or unjudged (nothing could be compared)."""
    statuses = [r["status"] for r in rows]
    if "fail" in statuses:
        return "fail", next(r["detail"] for r in rows if r["status"] == "fail")
    if "drift" in statuses:
        return "drift", next(r["detail"] for r in rows if r["status"] == "drift")
    if "pass" in statuses:
        return "pass", f"{statuses.count('pass')} checks pass"
    return "unjudged", ("no module records to judge it by (capture with no op filter writes them) and none of its "
                        "unmatched ops could be replayed")


def _step_pairs(a: Dump, b: Dump):
    """(A's records, B's records) of each step, in step order: the unit of alignment (its key
    starts with the step), read one step at a time; both captures whole, once, when either's steps
    do not follow one another (a loop that set the step by hand)."""
    if not (a.in_step_order and b.in_step_order):
        yield a.records, b.records
        return
    chunks_a, chunks_b = a.step_chunks(), b.step_chunks()
    ca, cb = next(chunks_a, None), next(chunks_b, None)
    while ca is not None or cb is not None:
        if cb is None or (ca is not None and ca[0] < cb[0]):
            yield ca[1], []
            ca = next(chunks_a, None)
        elif ca is None or cb[0] < ca[0]:
            yield [], cb[1]
            cb = next(chunks_b, None)
        else:
            yield ca[1], cb[1]
            ca, cb = next(chunks_a, None), next(chunks_b, None)


@dataclass
class _Carried:
    """What the judging of a step takes from the steps before it."""

    first_fail: int | None = None  # call index of the earliest failure so far
    first_draw: int | None = None  # of the earliest op of A that drew other random numbers
    upstream: "_Upstream" = field(default_factory=lambda: _Upstream())
    steps: tuple[StepReader, StepReader] | None = None  # the runs' optimizer step descriptions
    state: "_States | None" = None  # the runs' model states (model_state)
    stats_drift: "_StatsDrift" = field(default_factory=lambda: _StatsDrift())


@dataclass
class _States:
    """What judges the runs' state and data records (model_state): their names, and why a state
    difference may be drift."""

    runs: tuple[model_state.RunState, model_state.RunState]
    seen: Counter = field(default_factory=Counter)  # state records judged so far, per module

    @classmethod
    def of(cls, a: Dump, b: Dump) -> "_States | None":
        ra, rb = model_state.read_meta(a.meta), model_state.read_meta(b.meta)
        return None if ra is None or rb is None else cls((ra, rb))

    def row(self, a: Dump, b: Dump, ra: dict, rb: dict) -> dict:
        module, (run_a, run_b) = ra.get("module"), self.runs
        why = None
        if ra["op"] == model_state.INPUT_OP:  # data: no training drifts it
            names = (run_a.inputs.get(module or "", []), run_b.inputs.get(module or "", []))
        else:
            k = self.seen[module]
            self.seen[module] += 1
            names = (run_a.names(module, k), run_b.names(module, k))
            step = ra.get("step")
            if run_a.trained_before or run_b.trained_before:
                why = (f"{'A' if run_a.trained_before else 'B'} trained before the capture (its optimizer held "
                       "state at its first step in it): weights drift apart honestly")
            elif run_a.first_step is not None and isinstance(step, int) and step > run_a.first_step:
                why = "taken after an optimizer step of the capture: weights drift apart honestly"
        return _row(ra, *model_state.judge(ra, rb, a.load(ra), b.load(rb), names, why))


def _compare_by_structure(a: Dump, b: Dump, options: CompareOptions, report: DiffReport) -> None:
    described = [os.path.isfile(os.path.join(d.path, OPTIMIZER_STEPS)) for d in (a, b)]
    if described[0] != described[1]:
        report.notes.append(f"only {'A' if described[0] else 'B'} describes its optimizer steps ({OPTIMIZER_STEPS}; "
                            "the other is a capture of an earlier version): the runs' optimizer options are not "
                            "compared and no optimizer step is replayed")
    carried = _Carried(steps=(StepReader(a.path), StepReader(b.path)), state=_States.of(a, b))
    if carried.state is None:
        report.notes.append("a capture of an earlier version does not record the model's parameters and buffers "
                            "before its first op: that the runs start from the same ones is not checked")
    for records_a, records_b in _step_pairs(a, b):
        _compare_step(a, b, records_a, records_b, options, report, carried)


def _gradients_apart(al: Alignment) -> bool:
    """Whether a step's gradients already differ between the runs: a backward op's or module record's
    statistics are not the same numbers, or a module's backward ran other ops."""
    return any(phase == "backward" for _, phase, _ in al.regions) or any(
        ra.get("phase") == "backward" and "stats" in ra and ra.get("stats") != rb.get("stats")
        for ra, rb in [*al.pairs, *al.module_pairs])


def _optimizer_stats_drift(row: dict, ra: dict, rb: dict, noise: set[int] | frozenset[int]) -> None:
    """An optimizer's op (or a step's parameters, PARAMS_OP) whose statistics differ, in a step whose
    gradients already differ between the runs (_gradients_apart), is drift, not a failure, where the
    norm of each output that differs agrees: Adam divides each gradient by its own running magnitude,
    so gradients a rounding apart give steps far apart wherever a gradient is near zero (a
    zero-initialised bias's first step, an attention key's bias, whose gradient cancels), which moves
    the mean, minimum and maximum but hardly the norm. So is one the size of a gradient that is rounding
    noise (``noise``: the sizes of sums that cancel, note_reduction_scales), whose every statistic the
    runs round differently. Statistics cannot bound that; a full capture replays the optimizer's ops on
    each run's own inputs. Marks ``row`` (failed by the stats rule)."""
    pairs = [(x, y) for x, y in zip(ra.get("stats") or [], rb.get("stats") or [])
             if stats_difference(x, y, stats_rtol(x)) is not None]
    if pairs and all(stats_difference(x, y, stats_rtol(x), keys=("norm",)) is None for x, y in pairs):
        row.update(status="drift", detail="the step's gradients already differ and an optimizer amplifies that "
                                          f"where a gradient is near zero (norms agree): {row['detail']}")
    elif pairs and all(y.get("numel") in noise for _, y in pairs):
        row.update(status="drift", detail="a gradient of its size is rounding noise (a sum that cancels), which "
                                          f"the runs round differently and an optimizer scales up: {row['detail']}")


def _stats_failure_in_optimizer(row: dict) -> bool:
    return row["status"] == "fail" and row["rule"] == "stats" and row["phase"] == "optimizer"


def _after_other_draws(ops: list[dict], first_draw: int | None) -> None:
    """A stats capture's ops after draws other than the reference's: their inputs differ by the draws, and
    with statistics alone (no tensors to replay each op on its own inputs, as a full capture does) an op
    that differs cannot be told from a fault: drift, not a failure."""
    for r in ops if first_draw is not None else ():
        if r["status"] == "fail" and r["rule"] == "stats" and r["index"] > first_draw:
            r.update(status="drift", detail=f"differs after random draws (#{first_draw}), which the runs make "
                                            f"differently, and a stats capture cannot replay it: {r['detail']}")


def _params_apart(records_a: list[dict], records_b: list[dict], noise: set[int]) -> dict[tuple, float] | None:
    """How far apart the runs hold their parameters after this step's last optimizer step (a stats
    capture's PARAMS_OP records), by shape, as the statistics of a parameter of that shape estimate it
    (difference_estimate): a matrix's ||a - b|| / ||b||, a vector's root mean square difference
    (||a - b|| / sqrt(n), to be set against what it is added to or scales). A parameter whose size is
    that of a gradient that was rounding noise (``noise``) is left out: its steps are its gradient's noise
    scaled up (a key projection's bias, which softmax ignores), so its drift says nothing of what it
    feeds. None where no step recorded the parameters in both runs."""
    after = [{r.get("step"): r for r in records if r["op"] == PARAMS_OP and r.get("kind") == "module"}
             for records in (records_a, records_b)]
    steps = [step for step in after[0] if step in after[1]]
    if not steps:
        return None
    ra, rb = after[0][steps[-1]], after[1][steps[-1]]
    apart: dict[tuple, float] = {}
    for x, y, out in zip(ra.get("stats") or [], rb.get("stats") or [], rb.get("outputs") or []):
        if not (isinstance(x, dict) and isinstance(y, dict) and isinstance(out, dict)) or y.get("numel") in noise:
            continue
        moved, shape = difference_estimate(x, y), tuple(out.get("shape") or ())
        if moved is not None and y.get("norm") and math.isfinite(moved):
            # a vector (a bias, a norm's weight) moves what it is added to or scales by its own
            # elements' drift; a matrix moves a product by its drift relative to itself
            drift = moved / math.sqrt(max(y.get("numel", 1), 1)) if len(shape) == 1 else moved / y["norm"]
            apart[shape] = max(apart.get(shape, 0.0), drift)
    return apart


# A stats capture's drift budget grows as a full capture's module records' does (DRIFT_GROWTH, 4): the drift
# its inputs carry is estimated (difference_estimate), not bounded from below. With the lower bounds alone it
# took 8x, and still failed honest runs: a gradient 7.2e-5 apart (||a - b|| / ||b||) showed 2e-6 in its
# statistics, and the product of GELU's backward with it showed the whole 9.2e-5 in its maximum (GPT-2).
STATS_DRIFT_GROWTH = 4.0
# An op judged by its own statistics: the sums' estimate of its drift counts up to this many times the least rtol
# at which its statistics pass. RMSNorm's backward in bf16 (autocast against a bf16 model) expands a row's sum
# over the hidden size, 32 copies of each difference: the estimate 1.24, its statistics' ratio 0.017, the
# op it expands 0.22. A 1e-3 fault in GPT-2's query-key-value projection: the estimate 1.29e-3, the ratio 7.5e-4.
OWN_ESTIMATE_CAP = 2.0


@dataclass
class _StatsDrift:
    """Stats captures after an optimizer step that left the runs' parameters apart (_params_apart): honest kernels
    round gradients differently, and an optimizer that divides by a gradient's own size turns that rounding into
    whole steps where a gradient is near zero, so later ops read weights and activations that differ a little. A
    stats record holds no inputs to replay it on (a full capture's rule), so an op is judged against the drift
    its inputs carry, as a full capture judges its module records (_Upstream): within STATS_DRIFT_GROWTH x the
    largest of the drift of the parameters it reads (those of its tensor arguments' shapes), the drift of the
    last DRIFT_WINDOW paired ops before it (outside regions and the optimizer), that of the same op a step
    before (honest drift grows from step to step, a fault planted in one step jumps) and, in backward, that of
    its module's forward ops this step (what the forward saved for it, often further back than the window); a
    module record, as much as the op whose output it is and the same record a step before. An op's drift is the
    larger of its stats_ratio and its outputs' relative difference as their statistics estimate it
    (summaries_apart): a gradient 7.2e-5 apart can keep its norm and extremes within 2e-6, and an elementwise
    product with it then shows the whole difference in its maximum. A fault far above that drift is still found;
    before the parameters differ nothing is widened."""

    params: dict[tuple, float] = field(default_factory=dict)  # shape -> drift (relative, estimated)
    recent: list[float] = field(default_factory=list)
    allowed: dict[tuple, float] = field(default_factory=dict)  # A's output statistics -> the drift its op had
    # (phase, module, op, occurrence in the step) -> the drift of that op or module record: the last step's,
    # and this step's so far (a step's parameters, PARAMS_OP, carry the last step's drift into the next: Qwen2's
    # key bias, whose gradient is rounding noise, 1.3e-4 apart after step 1 and 1.9e-4 after step 2)
    before: dict[tuple, float] = field(default_factory=dict)
    now: dict[tuple, float] = field(default_factory=dict)
    seen: Counter = field(default_factory=Counter)  # (phase, module, op) -> rows this step
    forward: dict[str, float] = field(default_factory=dict)  # module -> its forward ops' drift, this step

    def judge(self, rows: list[tuple[dict, dict, dict]], in_region: set) -> None:
        """``rows``: (row, record of A, record of B) of a step's paired ops, in call order."""
        self.allowed.clear()
        self.forward.clear()
        for row, ra, rb in rows:
            drift = self.widen_in_step(row, ra, rb)
            if drift is not None and row["status"] == "pass" and row["phase"] != "optimizer" and \
                    group_key(row) not in in_region:
                self.recent = [*self.recent[1 - DRIFT_WINDOW:], drift]
                if row["phase"] == "forward" and row["module"]:
                    self.forward[row["module"]] = max(self.forward.get(row["module"], 0.0), drift)

    def widen_in_step(self, row: dict, ra: dict, rb: dict) -> float | None:
        """widen, with the same op's or module record's drift a step before; notes its drift for the next."""
        place = (row["phase"], row["module"], row["op"])
        place += (self.seen[place],)
        self.seen[place[:3]] += 1
        drift = self.widen(row, ra, rb, self.before.get(place, 0.0))
        if drift is not None:
            self.now[place] = drift
        return drift

    def _carried(self, ra: dict, rb: dict, before: float) -> tuple[float, str]:
        shapes = [tuple(t.get("shape") or ()) for t in ra.get("inputs") or [] if isinstance(t, dict)]
        outs = [st for st in rb.get("stats") or [] if isinstance(st, dict)]
        rms = outs[0]["norm"] / math.sqrt(max(outs[0].get("numel", 1), 1)) if outs and outs[0].get("norm") else 0.0
        # (a weight is often read transposed: a linear layer's mm of x and W.t())
        found = [(drift if len(shape) > 1 else drift / rms if rms else 0.0, "a parameter it reads")
                 for shape in {*shapes, *(s[::-1] for s in shapes)} if (drift := self.params.get(shape))]
        found += [(self.allowed.get(same_numbers(st), 0.0), "the op that returned it")
                  for st in ra.get("stats") or [] if ra.get("kind") == "module" and isinstance(st, dict)]
        found.append((max(self.recent, default=0.0), f"the ops before it (the largest of {len(self.recent)})"))
        found.append((before, "the same op a step before"))
        if ra.get("phase") == "backward":  # what its module's forward saved for it
            found.append((self.forward.get(ra.get("module") or "", 0.0), "its module's forward ops"))
        return max(found)

    def widen(self, row: dict, ra: dict, rb: dict, before: float = 0.0) -> float | None:
        """Passes ``row`` (a stats row that failed) where its statistics are within the drift its inputs
        carry (``before``: the same op's a step before); returns the op's own drift, for the ops after it
        (None for a row not judged by statistics)."""
        if not self.params or row["rule"] not in ("stats", "drift_budget") or \
                (apart := summaries_apart(ra, rb)) is None:
            return None
        ratio, estimate = apart
        carried, source = self._carried(ra, rb, before)
        drift = max(ratio, estimate)
        # judged itself, an op's estimate counts up to OWN_ESTIMATE_CAP x its ratio: the sums' difference
        # assumes differences of either sign, and a tensor that repeats its elements (an expand, and what is
        # computed from it) multiplies it by the root of the repeats
        own = max(ratio, min(estimate, OWN_ESTIMATE_CAP * ratio))
        for st in ra.get("stats") or [] if ra.get("kind", "op") == "op" else []:
            if isinstance(st, dict) and (key := same_numbers(st)) is not None:
                self.allowed[key] = max(self.allowed.get(key, 0.0), carried)
        if row["status"] == "fail" and row["rule"] == "stats" and own <= STATS_DRIFT_GROWTH * carried:
            row.update(status="pass", rule="drift_budget",
                       detail=f"statistics {own:.3g} apart (relative) within "
                              f"{STATS_DRIFT_GROWTH:g} x the drift its inputs carry after an optimizer step left the "
                              f"parameters apart ({source}: {carried:.3g}); elementwise: {row['detail']}")
        return drift

    def after_step(self, records_a: list[dict], records_b: list[dict], noise: set[int]) -> None:
        if self.params:
            self.before = self.now
        self.now = {}
        self.seen.clear()
        apart = _params_apart(records_a, records_b, noise)
        if apart is not None:
            self.params = {shape: d for shape, d in apart.items() if d > 0}


def _earliest(*values: int | None) -> int | None:
    return min((v for v in values if v is not None), default=None)


def _compare_step(a: Dump, b: Dump, records_a: list[dict], records_b: list[dict], options: CompareOptions,
                  report: DiffReport, carried: _Carried) -> None:
    """The rows of one step (or of the whole runs: see _step_pairs), added to ``report``."""
    noise = note_reduction_scales(records_b)  # the reference's: stats captures' rounding of sums that cancel
    al = align(records_a, records_b, options.equivalences)
    # Inside a region (another implementation of a module) ops pair where their outputs' shapes
    # happen to agree: what they were called with differs by design, and the region's module
    # records judge it.
    in_region = set(al.regions)
    ops = [compare_records(a, b, ra, rb, options, arguments=group_key(ra) not in in_region) for ra, rb in al.pairs]
    apart = _gradients_apart(al)
    for row, (ra, rb) in zip(ops, al.pairs) if apart else ():
        if _stats_failure_in_optimizer(row):
            _optimizer_stats_drift(row, ra, rb, noise)
    carried.stats_drift.judge(sorted(zip(ops, (p[0] for p in al.pairs), (p[1] for p in al.pairs)),
                                     key=lambda x: x[0]["index"]), in_region)
    unmatched = []
    for ra in al.unmatched_a:
        unmatched.append(_row(ra, "unmatched", "alignment", "only in A (the run under test)") | {"run": "A"})
    for rb in al.unmatched_b:
        unmatched.append(_row(rb, "unmatched", "alignment", "only in B (the reference)") | {"run": "B"})
    if carried.state is None:  # state records of one run only: nothing to judge them with (noted once)
        al.unmatched_modules_a = [r for r in al.unmatched_modules_a if r["op"] not in model_state.OPS]
        al.unmatched_modules_b = [r for r in al.unmatched_modules_b if r["op"] not in model_state.OPS]
    else:  # what each run held before its first op and was fed, compared directly
        ops.extend(carried.state.row(a, b, ra, rb) for ra, rb in al.module_pairs if ra["op"] in model_state.OPS)
    for ra in al.unmatched_modules_a:
        unmatched.append(_row(ra, "unmatched", "alignment", "module record only in A") | {"run": "A"})
    for rb in al.unmatched_modules_b:
        unmatched.append(_row(rb, "unmatched", "alignment", "module record only in B") | {"run": "B"})
    policy = options.equivalences.mixed_precision
    for ra in al.casts_a:  # judged where they run, like a region's own ops
        row = self_check(a, ra, options)
        row["detail"] = f"a cast of the mixed-precision policy ({policy.describe()}), {row['detail']}"
        ops.append(row)
    for rb in al.casts_b:
        unmatched.append(_row(rb, "unmatched", "mixed_precision",
                              f"a cast of the mixed-precision policy ({policy.describe()}) in B") | {"run": "B"})
    # A region's unmatched ops of A are judged against their own float64 replay (immune to inherited
    # drift); its module records directly, which tells a fault apart only before the first divergence.
    own_ops: dict = {}
    drawn_b = _Draws(records_b)
    for ra in al.unmatched_a:
        own_ops.setdefault(group_key(ra), []).append(ra)
    region_rows: dict = {}
    for region in al.regions:
        name = f"{region[2] or '(no module)'} ({region[1]}, step {region[0]})"
        own_a, own_b = own_ops.get(region, []), [rb for rb in al.unmatched_b if group_key(rb) == region]
        rows = region_rows[region] = [self_check(a, ra, options) | {"region": name} for ra in own_a]
        _reordered_summaries(rows, own_a, own_b, options)
        _one_sided_draws(rows, region, drawn_b)
        judges = region_module_records(al, region)
        if not judges and not own_b:
            _inserted_ops(rows, own_a, a)
        elif not judges and all(_moves_values(ra) for ra in own_a):
            # A only moves values there (views, copies); B's ops must too (DDP's copies out of its buckets)
            rows.append(_reference_insertions(own_b, b) | {"region": name})
        rows.extend(({"region": name}, ra, rb) for ra, rb in judges)
    own_rows = [r for rows in region_rows.values() for r in rows if isinstance(r, dict)]
    if carried.steps is not None:  # the optimizers' options, step by step, ranked where each step starts
        ops.extend(_option_rows(records_a, carried.steps))
    # Random draws (A's ops that drew, judged by their contracts or skipped) differ between runs by
    # design (another seed, device or kernel draws other numbers): module records after the first
    # are compared like those after a divergence.
    first_draw = _earliest(carried.first_draw, *(r["index"] for r in ops + own_rows if _drew(r)))
    _after_other_draws(ops, first_draw)
    first_fail = _earliest(carried.first_fail, *(r["index"] for r in ops + own_rows if r["status"] == "fail"))
    # module records in call order: the first that fails before any divergence is one
    pending = sorted(((region, item) for region, rows in region_rows.items() for item in rows
                      if isinstance(item, tuple)), key=lambda x: x[1][1]["index"])
    upstream = carried.upstream
    upstream.add_step(ops, in_region)
    for region, (tag, ra, rb) in pending:
        row = compare_records(a, b, ra, rb, options) | tag
        if options.shards is None:  # (a TP run's module records are judged on statistics gathered over ranks)
            carried.stats_drift.widen_in_step(row, ra, rb)
        if ra["op"] == PARAMS_OP and carried.steps is not None:
            row = _optimizer_row(a, b, ra, rb, row, records_a, records_b, carried.steps, options)
            if row["rule"] == "optimizer_replay":  # judged on each run's own inputs: no drift
                if row["status"] == "fail":
                    first_fail = _earliest(first_fail, ra["index"])
                upstream.weights(row)
                region_rows[region].append(row)
                continue
        if (row["status"] == "fail" and row["rule"] == "allclose" and (first_fail is None or ra["index"] < first_fail)
                and (first_draw is None or ra["index"] < first_draw)):
            upstream.judge(row, _region_start(records_a, region))  # else drift below: other draws may explain it
        if ra["op"] == PARAMS_OP:
            if apart and _stats_failure_in_optimizer(row):  # a region's (fused against foreach, say)
                _optimizer_stats_drift(row, ra, rb, noise)
            upstream.weights(row)
        if row["status"] == "fail":
            if first_fail is not None and ra["index"] > first_fail:
                row.update(status="drift", detail=f"differs after the first divergence (#{first_fail}), so the "
                                                  f"difference may be inherited: {row['detail']}")
            elif first_draw is not None and ra["index"] > first_draw:
                row.update(status="drift", detail=f"differs after random draws (#{first_draw}), which the runs make "
                                                  f"differently, so the difference may come from them: {row['detail']}")
            else:
                first_fail = ra["index"]
        region_rows[region].append(row)
    carried.first_fail, carried.first_draw = first_fail, first_draw
    carried.stats_drift.after_step(records_a, records_b, noise)
    # a region's ops that were paired (a random op judged on its own draws, say) count too: a
    # module record that differs after the divergence is not drift when an op inside it failed
    paired_fails: dict = {}
    for r in ops:
        if r["status"] == "fail":
            paired_fails.setdefault(group_key(r), []).append(r)
    regions = []
    for region, rows in region_rows.items():
        rows = [r for r in rows if not isinstance(r, tuple)]
        verdict, detail = _region_verdict(paired_fails.get(region, []) + rows)
        step, phase, module = region
        regions.append({"step": step, "phase": phase, "module": module, "verdict": verdict, "detail": detail,
                        "n_module_records": sum(r["op"].startswith(("module::", "optimizer::")) for r in rows),
                        "n_ops_checked": sum(r["status"] in ("pass", "fail") and "::" in r["op"]
                                             and not r["op"].startswith(("module::", "optimizer::")) for r in rows)})
        ops.extend(rows)
    # at one index: ops, then module records, outer modules first (a module and its last child
    # return together; the region is the module)
    ops.sort(key=lambda r: (r["index"], r["op"].startswith(("module::", "optimizer::")),
                            (r["module"] or "").count(".")))
    report.add(ops, unmatched, regions)


def _option_rows(records_a: list[dict], steps: tuple[StepReader, StepReader]) -> list[dict]:
    """A failing row (rule ``arguments``) for each optimizer step of A whose options differ from the
    reference's (optimizer_replay.option_differences): a changed learning rate is no drift. It is
    ranked where the step starts, before the ops whose arguments the option changed, when the
    capture says where (else at the parameters after it)."""
    rows = []
    for ra in records_a:
        if ra["op"] != PARAMS_OP or ra.get("kind") != "module":
            continue
        desc_a, desc_b = steps[0].get(ra.get("step")), steps[1].get(ra.get("step"))
        if desc_a is None or desc_b is None or not (changed := option_differences(desc_a, desc_b)):
            continue
        rows.append(_row(ra, "fail", "arguments", "; ".join(changed))
                    | {"index": min(desc_a.get("index", ra["index"]), ra["index"])})
    return rows


def _optimizer_row(a: Dump, b: Dump, ra: dict, rb: dict, row: dict, records_a: list[dict], records_b: list[dict],
                   steps: tuple[StepReader, StepReader], opts: CompareOptions) -> dict:
    """An optimizer step's parameters (a ``PARAMS_OP`` row of a region) outside the elementwise
    tolerance: judged by replaying the step from each run's own inputs (optimizer_replay, the
    error-ratio rule), where both runs recorded it; else the row says why it was not replayed."""
    if row["status"] != "fail" or row["rule"] != "allclose":
        return row
    try:
        verdict = _replayed_step(a, b, ra, rb, records_a, records_b, steps, opts)
    except NotReplayable as exc:
        return row | {"detail": f"{row['detail']} (the step is not replayed: {exc})"}
    deciding = verdict.deciding or verdict.verdicts[0]
    judged = _row(ra, "pass" if verdict.passed else "fail", "optimizer_replay",
                  f"each run's parameters after the step against torch's float64 replay of it from that run's own "
                  f"inputs: {deciding.detail}; directly: {row['detail']}", verdict)
    return row | judged


def _replayed_step(a: Dump, b: Dump, ra: dict, rb: dict, records_a: list[dict], records_b: list[dict],
                   steps: tuple[StepReader, StepReader], opts: CompareOptions) -> TreeVerdict:
    """Each run's parameters after the step (``ra``, ``rb``) against its own replay, a parameter at a
    time (one parameter's float64 copies held, whatever the model's size); NotReplayable says why not."""
    step = ra.get("step")
    desc_a, desc_b = steps[0].get(step), steps[1].get(step)
    if desc_a is None or desc_b is None:
        raise NotReplayable(f"{'A' if desc_a is None else 'B'} did not describe it ({OPTIMIZER_STEPS})")
    inputs = inputs_record(records_a, step), inputs_record(records_b, step)
    if inputs[0] is None or inputs[1] is None:
        raise NotReplayable(why_not(desc_a) or why_not(desc_b) or "a run did not record what it started from")
    da, db, after_a, after_b = a.load(inputs[0]), b.load(inputs[1]), a.load(ra), b.load(rb)
    if da is None or db is None or after_a is None or after_b is None:
        raise NotReplayable("its tensors were not saved (past a capture's max_bytes)")
    in_a, in_b = tensor_leaves(da["outputs"]), tensor_leaves(db["outputs"])
    out_a, out_b = tensor_leaves(after_a["outputs"]), tensor_leaves(after_b["outputs"])
    if opts.shards is not None:  # a TP rank's slices joined with its peers': the step replayed whole (each
        # parameter's step is elementwise in its gradient and state, so the slices' replays joined are it)
        in_a, out_a = opts.shards.gather(inputs[0], in_a, in_b), opts.shards.gather(ra, out_a, out_b)
        if [t.shape for t in in_a] != [t.shape for t in in_b]:
            raise NotReplayable("A's TP ranks' slices of what the step started from do not add up to B's")
    if [(t.dtype, t.shape) for t in out_a] != [(t.dtype, t.shape) for t in out_b]:
        raise NotReplayable("the runs keep the parameters in other dtypes or shapes (their replays' errors "
                            "are not comparable)")
    verdict = TreeVerdict()
    replays = zip(replay(desc_a, in_a), replay(desc_b, in_b))
    for x, y, (fa, fb) in zip(out_a, out_b, replays):
        verdict.verdicts.append(compare_error_ratio(x, y, fa, k=opts.ratio_k, reference_fp64=fb))
    if not out_a or len(verdict.verdicts) != len(out_a):
        raise NotReplayable(f"{len(out_a)} parameters after it, {len(verdict.verdicts)} replayed")
    return verdict


# A module record is compared directly with the reference's, so after the runs' weights or
# activations drift apart (honest kernels round differently: a step later the weights differ) an
# elementwise tolerance fails it although no op failed its own check. Its difference is instead
# judged against the drift its inputs already carry: the largest relative difference
# (||a - b|| / ||b||) of the last DRIFT_WINDOW paired ops before it that passed their own checks
# (outside regions) and of the parameters after earlier optimizer steps, times DRIFT_GROWTH.
DRIFT_WINDOW = 16
DRIFT_GROWTH = 4.0


class _Upstream:
    """The drift the runs carry at each point of the call order (see DRIFT_WINDOW), built a step
    at a time: of the steps before, only what a later query can use is kept."""

    def __init__(self) -> None:
        self._index: list[int] = []
        self._drift: list[float] = []
        self._weights: list[tuple[int, float]] = []  # (index, drift) of the parameters after a step

    def add_step(self, rows: list[dict], in_region: set) -> None:
        """A step's paired ops (its queries come after every earlier step's records)."""
        del self._index[:-DRIFT_WINDOW], self._drift[:-DRIFT_WINDOW]
        if self._weights:  # every earlier step's weights precede this step's queries: their largest is enough
            self._weights = [max(self._weights, key=lambda w: w[1])]
        eligible = sorted((r["index"], r["drift"]) for r in rows
                          if r["status"] == "pass" and math.isfinite(r.get("drift", math.inf))
                          and group_key(r) not in in_region and not r["op"].startswith(("module::", "optimizer::")))
        self._index += [i for i, _ in eligible]
        self._drift += [d for _, d in eligible]
        for r in rows:  # paired optimizer ops (the same kernels in both runs) measure the weights too
            if r["phase"] == "optimizer" and r["status"] == "pass" and math.isfinite(r.get("drift", math.inf)):
                self._weights.append((r["index"], r["drift"]))

    def weights(self, row: dict) -> None:
        if row["status"] in ("pass", "drift") and math.isfinite(row.get("drift", math.inf)):
            self._weights.append((row["index"], row["drift"]))

    def budget(self, index: int) -> tuple[float, str]:
        import bisect

        end = bisect.bisect_left(self._index, index)
        window = list(zip(self._index[max(0, end - DRIFT_WINDOW):end], self._drift[max(0, end - DRIFT_WINDOW):end]))
        at, drift = max(window, key=lambda x: x[1], default=(None, 0.0))
        # a module record is numbered as the op after it: the parameters after a step precede that op
        weights = max((d for i, d in self._weights if i <= index), default=0.0)
        if weights > drift:
            return DRIFT_GROWTH * weights, f"the parameters' after earlier steps, {weights:.3g}"
        return DRIFT_GROWTH * drift, f"op #{at}'s, {drift:.3g}"

    def judge(self, row: dict, start: int) -> None:
        """A module record that failed the elementwise tolerance passes when its difference is
        within the drift its region's inputs carry: measured before the region's first op
        (``start``), as the region's own ops (paired children included) may carry a fault's drift."""
        own = row.get("drift")
        if own is None:
            return
        budget, source = self.budget(min(row["index"], start))
        if own <= budget:
            row.update(status="pass", rule="drift_budget",
                       detail=f"||a - b|| / ||b|| = {own:.3g} within {DRIFT_GROWTH:g} x the drift its inputs carry "
                              f"(the largest before it: {source}); elementwise: {row['detail']}")


def _region_start(records: list[dict], region: tuple) -> int:
    """The call index of the first op of a region's module (or of its submodules) in its step and
    phase; for an optimizer region, of the step's first optimizer op."""
    step, phase, module = region
    found = [r["index"] for r in records if r.get("kind", "op") == "op" and group_key(r)[:2] == (step, phase)
             and (module is None or (r.get("module") or "") == module
                  or (r.get("module") or "").startswith(module + "."))]
    return min(found, default=0)


def rank_dirs(path: str) -> dict[int, str] | None:
    """{rank: capture directory} for a directory of rank{r} captures (directly or under capture/,
    as ditorch_precision.run writes them); None for a single capture."""
    if os.path.isfile(os.path.join(path, "index.jsonl")):
        return None
    for base in (path, os.path.join(path, "capture")):
        if os.path.isdir(base):
            found = {int(m.group(1)): os.path.join(base, name) for name in sorted(os.listdir(base))
                     if (m := re.fullmatch(r"rank(\d+)", name)) and os.path.isdir(os.path.join(base, name))}
            if found:
                return found
    return None


@dataclass
class RankReport:
    """A cross-rank compare: one DiffReport per rank, and the collectives of run A checked across ranks."""

    reports: dict[int, DiffReport]
    collectives: list[dict]

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.reports.values()) and all(c["status"] != "fail" for c in self.collectives)

    @property
    def first_divergence(self) -> dict | None:
        firsts = [{**r.first_divergence, "rank": rank} for rank, r in self.reports.items() if r.first_divergence]
        firsts += [c for c in self.collectives if c["status"] == "fail"]
        return min(firsts, key=lambda f: (f.get("step") or 0, f.get("index") or 0, f.get("rank") or 0), default=None)

    @property
    def notes(self) -> list[str]:
        """The ranks' notes, each once, prefixed with the ranks it concerns."""
        ranks: dict[str, list[int]] = {}
        for rank, r in sorted(self.reports.items()):
            for note in r.notes:
                ranks.setdefault(note, []).append(rank)
        return [f"rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))}: {note}" for note, rs in ranks.items()]

    def to_dict(self) -> dict:
        per_rank = {rank: r.to_dict() for rank, r in self.reports.items()}
        total = lambda key: sum(d[key] for d in per_rank.values())  # noqa: E731
        return {"passed": self.passed, "ranks": sorted(self.reports), "notes": self.notes,
                "first_divergence": self.first_divergence, "n_ops": total("n_ops"), "n_passed": total("n_passed"),
                "n_failed": total("n_failed"),
                "n_skipped": total("n_skipped"), "n_unmatched": total("n_unmatched"),
                "collectives": self.collectives, "per_rank": per_rank}


def compare_ranks(dir_a: str, dir_b: str, options: CompareOptions | None = None, *,
                  tp_shards: bool = False) -> RankReport:
    """Compare two runs rank by rank (their rank{r} capture directories); the collectives of run A
    are judged by their cross-rank invariants on A's own captured inputs, so drift from another
    rank's fault is not blamed on them. ``tp_shards``: A's ranks are one tensor-parallel group and
    B is one rank of the same model (ditorch_precision.shards): every rank of A against B's."""
    ra, rb = rank_dirs(dir_a), rank_dirs(dir_b)
    if ra is None or rb is None:
        raise DumpError(f"{dir_a if ra is None else dir_b}: no rank{{r}} capture directories")
    options = options or CompareOptions()
    if tp_shards:
        if len(rb) != 1 or len(ra) < 2:
            raise DumpError(f"a tensor-parallel compare takes a run of several ranks against a run of one: "
                            f"{len(ra)} rank(s) in {dir_a}, {len(rb)} in {dir_b}")
        dumps = [Dump.open(ra[rank]) for rank in sorted(ra)]
        (only,) = rb.values()
        reports = {rank: compare_dumps(ra[rank], only, options=replace(options, shards=TPShards(dumps, i)))
                   for i, rank in enumerate(sorted(ra))}
    elif set(ra) != set(rb):
        raise DumpError(f"the runs have different ranks: {sorted(ra)} in {dir_a}, {sorted(rb)} in {dir_b} (a "
                        "tensor-parallel run against a run of one rank: tp_shards, --tp-shards)")
    else:
        reports = {rank: compare_dumps(ra[rank], rb[rank], options=options) for rank in sorted(ra)}
    per_rank, carriers = {}, {}
    for rank in sorted(ra):
        dump = Dump.open(ra[rank])
        calls = [r for r in dump.iter_records()
                 if r.get("kind", "op") == "op" and is_collective(r["op"]) and r["op"] not in PLUMBING]
        with torch.no_grad():
            stats = [stats_from_capture(r, dump.load(r), len(ra)) for r in calls]
        per_rank[rank] = [s for s in stats if s is not None] + load_transfers(ra[rank])
        carriers[rank] = sorted((r.get("step") or 0, r["index"]) for r in calls)
    _handed_on(reports, carriers)
    _after_other_ranks(reports)
    return RankReport(reports, check_across_ranks(per_rank) if any(per_rank.values()) else [])


_RECORDS = ("module::", "optimizer::")
# Rules that judge an op by its outputs' summaries alone (stats, checksum captures): no tensors to
# replay it from, so an error its inputs carry fails it.
_SUMMARY_RULES = ("stats", "checksum")


def _handed_on(reports: dict[int, DiffReport], carriers: dict[int, list[tuple[int, int]]]) -> None:
    """An op judged by its summaries (``_SUMMARY_RULES``) that fails after a collective of its rank
    (``carriers``: (step, index) of each rank's collectives) which came after another rank's first
    divergence may hold that rank's error, handed on by the collective (a row-parallel layer's
    all-reduce): drift, not a divergence of its own rank. Ranks are taken in the order of their first
    divergences, so a rank whose every failure was handed on hands nothing on itself."""
    order = sorted((f.get("step") or 0, f["index"], rank) for rank, r in reports.items()
                   if (f := r.first_divergence) is not None)
    genuine: dict[int, tuple[int, int]] = {}  # rank -> (step, index) of a divergence of its own
    for _, _, rank in order:
        report = reports[rank]
        if genuine:
            step, index, source = min((s, i, r) for r, (s, i) in genuine.items())
            carrier = next((c for c in carriers.get(rank, ()) if c > (step, index)), None)
            for row in report.ops if carrier is not None else ():
                if (row["status"] == "fail" and row["rule"] in _SUMMARY_RULES
                        and (row.get("step") or 0, row["index"]) > carrier):
                    report.counts["op:fail"] -= 1
                    report.counts["op:drift"] += 1
                    row.update(status="drift", detail=f"differs after collective #{carrier[1]} (step {carrier[0]}), "
                                                      f"which came after the first divergence of rank {source} "
                                                      f"(#{index}, step {step}) and may carry it: {row['detail']}")
        first = report.first_divergence
        if first is not None:
            genuine[rank] = (first.get("step") or 0, first["index"])


def _after_other_ranks(reports: dict[int, DiffReport]) -> None:
    """A module record that fails after another rank's first divergence (a later call index of the
    same step, or a later step) may carry that rank's error, which a collective hands on (a
    row-parallel layer's all-reduce, DDP's gradient sum): drift, as after a divergence of its own
    rank. The ranks' call indices are comparable: they run the same ops. Ops are judged against
    their own replay and stay as they are."""
    firsts = {rank: r.first_divergence for rank, r in reports.items() if r.first_divergence}
    for rank, report in reports.items():
        other = min(((f.get("step") or 0, f["index"], r) for r, f in firsts.items() if r != rank), default=None)
        if other is None:
            continue
        step, index, source = other
        for row in report.ops:
            if row["status"] == "fail" and row["op"].startswith(_RECORDS) and (row.get("step") or 0, row["index"]) > (
                    step, index):
                report.counts["op:fail"] -= 1
                report.counts["op:drift"] += 1
                row.update(status="drift", detail=f"differs after the first divergence of rank {source} (#{index}, "
                                                  f"step {step}), which a collective may carry: {row['detail']}")
        for region in report.regions:
            name = f"{region['module'] or '(no module)'} ({region['phase']}, step {region['step']})"
            if region["verdict"] == "fail" and not any(r["status"] == "fail" and r.get("region") == name
                                                       and r.get("step") == region["step"] for r in report.ops):
                report.counts["region:fail"] -= 1
                report.counts["region:drift"] += 1
                region.update(verdict="drift", detail=f"its records differ after rank {source}'s first divergence")
