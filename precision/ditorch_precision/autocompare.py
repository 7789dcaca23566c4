"""autocompare: every selected op is run again on a reference device (default: CPU, float64) on
copies of its inputs, forward and backward, and its outputs are judged by the metrics library.
Collectives are not run again: they are checked across ranks (ditorch_precision.collectives).

An op whose outputs all pass the quick test (ditorch_precision.metrics.quick) is recorded with max_abs
only; every other op gets the full comparison and its full statistics."""
from __future__ import annotations

import json
import logging
import os

import torch
from torch.utils._pytree import tree_flatten, tree_leaves, tree_map, tree_unflatten

from .collectives import (PLUMBING, POINT_TO_POINT, check_across_ranks, exchange, group_ranks, input_copy,
                          inputs_stats, is_collective, outputs_stats, wait_collective, written)
from .dump import DumpWriter
from .metrics import ToleranceTable, compare_trees, op_tolerances, quick_pass
from .opinfo import op_info
from .point_to_point import TransferLog
from .random_contracts import contract_verdict
from .records import OpRecord
from .reference import convert_inputs, skip_reason
from .selection import Selector
from .tool import Tool

log = logging.getLogger("precision")


def _host_copy(tree):
    """Copies on the host, issued without waiting for the device (valid after a synchronise)."""
    return tree_map(lambda t: t.detach().to("cpu", non_blocking=True, copy=True) if isinstance(t, torch.Tensor) else t,
                    tree)


def _leaf_types(tree) -> list:
    """The dtype of each tensor leaf, in order (to cast reference copies back)."""
    return [t.dtype for t in tree_leaves(tree) if isinstance(t, torch.Tensor)]


def _synchronize() -> None:
    acc = getattr(torch, "accelerator", None)
    if acc is not None and acc.current_accelerator() is not None:
        acc.synchronize()


class AutoCompare(Tool):
    """``with AutoCompare() as ac: train()`` then ``ac.failures``.

    ``sync=True`` (default): inputs are copied to the reference before the op, the reference runs
    right after it and the copies are freed, so at most one op's copies are alive. ``sync=False``:
    no extra device synchronisation per op; host copies are queued and judged after each optimizer
    step (or ``flush()``), with one synchronisation, at the cost of holding one step's copies.
    ``full_stats=True``: full statistics for passing ops too (slower). ``save_failures``: a directory
    (``{rank}`` replaced) where each failing op's inputs and outputs are written in the capture
    format, for ``precision-diff replay DIR INDEX``. ``tolerances``: per op and
    dtype (see ``ToleranceTable``; ``rtol``/``atol`` are its fallback)."""

    name = "autocompare"

    def __init__(self, selector: Selector | None = None, *, device: str = "cpu",
                 dtype: torch.dtype | None = torch.float64,
                 rtol: float | None = None, atol: float | None = None, sync: bool = True, skip_views: bool = True,
                 out: str | None = None, full_stats: bool = False, tolerances: ToleranceTable | None = None,
                 save_failures: str | None = None, **kwargs) -> None:
        super().__init__(selector, **kwargs)
        self.save_failures = save_failures  # directory: failing ops' inputs, for precision-diff replay
        self._failure_dump: DumpWriter | None = None
        self.tolerances = tolerances or ToleranceTable(rtol=rtol, atol=atol)
        self.full_stats = full_stats
        self._warned = False
        self._skip: dict = {}  # op overload -> why it is not compared (None: it is)
        self.device, self.dtype = device, dtype
        self.rtol, self.atol = rtol, atol
        self.sync, self.skip_views = sync, skip_views
        self.out = out
        self.results: list[dict] = []
        self.collectives: list[dict] = []  # per collective call or transfer: sums and checksums
        self.transfers = TransferLog()  # point-to-point transfers (their records are in collectives too)
        self._collectives_checked = False
        self.n_skipped = 0
        self._queue: list = []
        self._tol_seen: set = set()  # (op, dtype) of the judged ops, when there are tolerance rules

    def unmatched_selection(self) -> list[str]:
        """The selector's patterns that matched nothing, and tolerance keys that matched no judged op
        or dtype (a misspelt key leaves the default tolerance in force)."""
        problems = super().unmatched_selection()
        try:
            self.tolerances.check_keys({op for op, _ in self._tol_seen}, {d for _, d in self._tol_seen if d},
                                       where="the ops autocompare judged")
        except ValueError as exc:
            problems.append(str(exc))
        return problems

    @property
    def failures(self) -> list[dict]:
        return [r for r in self.results if r["status"] == "fail"]

    def handle(self, rec: OpRecord, func, args, kwargs):
        if is_collective(rec.op):
            return self._collective(rec, func, args, kwargs)
        reason = self._skip.get(func, False)
        if reason is False:
            is_view = self.skip_views and op_info(func).is_view
            reason = self._skip[func] = skip_reason(func) or ("view" if is_view else None)
        if reason == "random op":
            return self._random(rec, func, args, kwargs)
        if reason or not any(isinstance(t, torch.Tensor) for t in tree_leaves((args, kwargs))):
            self.n_skipped += 1
            return func(*args, **kwargs)
        if not self.sync:
            with self.quiet():
                inputs = _host_copy((args, kwargs))
            out = func(*args, **kwargs)
            with self.quiet():
                self._queue.append((rec, func, inputs, _host_copy(out)))
            return out
        with self.quiet():  # before the op: in-place ops
            ref_args, ref_kwargs = convert_inputs(args, kwargs, self.device, self.dtype)
            originals = _leaf_types((args, kwargs)) if self.save_failures else None
        out = func(*args, **kwargs)
        with self.quiet():
            self._judge(rec, func, out, ref_args, ref_kwargs, originals)
        return out

    def _random(self, rec: OpRecord, func, args, kwargs):
        """A random op cannot be run again to the same draws: it is judged by its contract
        (ditorch_precision.random_contracts) on its own inputs and draws, where it has one."""
        out = func(*args, **kwargs)
        with self.quiet():
            verdict = contract_verdict(func, args, kwargs, out)
        if verdict is None:
            self.n_skipped += 1
        else:
            status, detail = verdict
            self.results.append({**rec.to_dict(), "status": status, "rule": "random_contract", "detail": detail})
        return out

    def _dispatch(self, func, args, kwargs):
        if self.transfers.waiting:
            self.transfers.before_op(op_info(func), args, kwargs, self.quiet)
        return super()._dispatch(func, args, kwargs)

    def _collective(self, rec: OpRecord, func, args, kwargs):
        """Run once, never again on the reference: record what the cross-rank check needs."""
        if rec.op in PLUMBING:
            return func(*args, **kwargs)
        group = group_ranks(rec.op, args)
        if rec.op in POINT_TO_POINT:
            return self._transfer(rec, func, args, kwargs, group)
        world = len(group) if group else 0
        with self.quiet():
            stats = inputs_stats(rec.op, args, world)
            before = input_copy(rec.op, args)
        out = func(*args, **kwargs)
        with self.quiet():
            wait_collective(out, rec.op)
            stats.update(outputs_stats(rec.op, args, written(rec.op, args, out), world, before))
        self.collectives.append({**rec.to_dict(), "group": group, **stats})
        return out

    def _transfer(self, rec: OpRecord, func, args, kwargs, group: list[int] | None):
        """A send's bytes are hashed as it is issued; a receive's when the program first uses its
        buffer (it is never waited for here: see point_to_point)."""
        out = self.transfers.run(rec.to_dict(), func, args, kwargs, group, self.quiet)
        self.collectives.append(self.transfers.records[-1])
        return out

    def check_collectives(self, timeout_s: float = 60.0) -> list[dict]:
        """Cross-rank check of the recorded collectives (through the default group's store); the rows
        go to ``results``. Called on exit; call it earlier if the process group is destroyed first."""
        if self._collectives_checked:
            return []
        self._collectives_checked = True
        self.transfers.resolve_all(self.quiet)
        try:
            per_rank = exchange(self.collectives, self.rank.get(), timeout_s)
        except (RuntimeError, ValueError) as exc:  # a rank that never reported (timeout), a closed store
            log.warning("autocompare: cross-rank check of %d collectives not done: %s", len(self.collectives), exc)
            per_rank = None
        if per_rank is None:
            if self.collectives:
                self.results.append({"op": "collectives", "status": "skipped", "rule": "skipped",
                                     "detail": "no initialised process group at the check: leave the tool "
                                               "(or call check_collectives) before destroy_process_group"})
            return []
        with self.quiet():  # the check's own tensor ops are not the program's
            rows = check_across_ranks(per_rank)
        self.results.extend(rows)
        return rows

    def _judge(self, rec: OpRecord, func, out, ref_args, ref_kwargs, originals=None) -> None:
        row = rec.to_dict()
        saved_inputs = (ref_args, ref_kwargs)
        if originals is not None and op_info(func).mutates:  # the reference run overwrites its copies
            saved_inputs = tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, saved_inputs)
        try:
            ref_out = func(*ref_args, **ref_kwargs)
        except Exception as exc:  # an op the reference device lacks (in this dtype): say so, go on
            row.update(status="skipped", rule="skipped", detail=f"reference failed: {type(exc).__name__}: {exc}")
            self.results.append(row)
            return
        if self.tolerances.rules:  # for the check that every tolerance key matched something
            self._tol_seen.add((rec.op, next((t.dtype for t in tree_leaves(out) if isinstance(t, torch.Tensor)
                                               and t.dtype.is_floating_point), None)))
        rtol, atol = op_tolerances(self.tolerances, rec.op, out, ref_out)
        quick = None if self.full_stats else quick_pass(out, ref_out, rtol=rtol, atol=atol)
        if quick is not None:
            row.update(status="pass", **quick)
            self.results.append(row)
            return
        verdict = compare_trees(out, ref_out, rtol=rtol, atol=atol)
        if not verdict.verdicts:
            self.n_skipped += 1
            return
        summary = verdict.summary()
        row.update(status="pass" if verdict.passed else "fail", **summary)
        self.results.append(row)
        if not verdict.passed and self.save_failures and originals is not None:
            self._save_failure(row, saved_inputs, originals, out)
        if not verdict.passed and not self._warned:  # the first failure
            self._warned = True
            log.warning("autocompare: first failure at %s #%d (%s, module %s): %s", rec.op, rec.index, rec.phase,
                        rec.module, summary["detail"])

    def _save_failure(self, row: dict, ref_inputs, originals, out) -> None:
        """The failing op's inputs as the op saw them: the reference copies, cast back (float64
        holds every float32/16 value exactly), with the device's outputs."""
        if self._failure_dump is None:
            self._failure_dump = DumpWriter(self.save_failures.format(rank=self.rank.get()))
        leaves, spec = tree_flatten(ref_inputs)
        kinds = iter(originals)
        back = [x.to(device="cpu", dtype=next(kinds)) if isinstance(x, torch.Tensor) else x for x in leaves]
        args, kwargs = tree_unflatten(back, spec)
        entry = {k: row[k] for k in ("index", "op", "overload", "phase", "module", "step", "rank")}
        self._failure_dump.write(entry, args, kwargs, out)
        row["saved"] = os.path.join(self.save_failures.format(rank=self.rank.get()), "tensors")

    def flush(self) -> None:
        """Judge the queued ops (no-sync mode): one synchronisation for all of them."""
        if not self._queue:
            return
        _synchronize()
        queue, self._queue = self._queue, []
        with self.quiet():  # called from an optimizer hook, where the mode is active
            for rec, func, (args, kwargs), out in queue:
                ref_args, ref_kwargs = convert_inputs(args, kwargs, self.device, self.dtype)
                self._judge(rec, func, out, ref_args, ref_kwargs, _leaf_types((args, kwargs)))

    def on_step(self) -> None:
        if not self.sync:
            self.flush()

    def finish(self) -> None:
        self.flush()
        if self.collectives:
            self.check_collectives()
        if self._failure_dump is not None:
            self._failure_dump.close(source="autocompare failures")
            self._failure_dump = None
        if self.out:
            path = self.out.format(rank=self.rank.get())
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            with open(path, "w") as f:
                for row in self.results:
                    f.write(json.dumps(row) + "\n")

    def summary(self) -> dict:
        fails = self.failures
        return {"n_compared": sum(r["status"] != "skipped" for r in self.results), "n_failed": len(fails),
                "n_skipped": self.n_skipped + sum(r["status"] == "skipped" for r in self.results),
                "first_failure": fails[0] if fails else None}
