"""Collectives (c10d:: ops) under the tools: they are never re-executed (a second collective on one
rank deadlocks or mismatches the others), their outputs are read only after the collective
completed, and they are checked by what must hold across ranks: every rank ends with the same
result, and an all-reduce's result is the reduction of the ranks' inputs."""
from __future__ import annotations

import json
import math
from datetime import timedelta

import torch
from torch.utils._pytree import tree_leaves

# Collectives whose outputs must be the same on every rank of the group.
SAME_EVERYWHERE = ("c10d::allreduce_", "c10d::allgather_", "c10d::broadcast_", "c10d::allreduce_coalesced_",
                   "c10d::_allgather_base_", "_c10d_functional::all_reduce", "_c10d_functional::broadcast",
                   "_c10d_functional::all_gather_into_tensor")
ALL_REDUCE = ("c10d::allreduce_", "_c10d_functional::all_reduce")
_FUNCTIONAL = ("_c10d_functional::", "c10d_functional::")
# Functional-collective plumbing: waiting and autograd wrapping, no communication of their own.
PLUMBING = ("_c10d_functional::wait_tensor", "_c10d_functional::_wrap_tensor_autograd",
            "c10d_functional::wait_tensor")


def is_collective(op: str) -> bool:
    return op.startswith("c10d::") or op.startswith(_FUNCTIONAL)


def wait_collective(out, op: str = "") -> None:
    """Wait for the collective to complete, so its outputs hold the result: the Work objects of a
    c10d op, ``wait_tensor`` on a functional collective's outputs (its own later wait is then a no-op)."""
    if op.startswith(_FUNCTIONAL) and op not in PLUMBING:
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                torch.ops._c10d_functional.wait_tensor(t)
        return
    for leaf in tree_leaves(out):
        if isinstance(leaf, torch.ScriptObject):
            try:
                work = torch._C._distributed_c10d.Work.unbox(leaf)
            except (RuntimeError, TypeError, AttributeError):
                continue
            work.wait()


def reduce_op_name(args) -> str | None:
    """'SUM', 'AVG', ... for an all-reduce's ReduceOp argument, or None if it cannot be read."""
    if len(args) > 1 and isinstance(args[1], str):  # functional collectives name it: "sum", "avg"
        return args[1].upper()
    for a in args:
        if isinstance(a, torch.ScriptObject):
            try:
                value = a.op()
            except Exception:  # not a ReduceOp (the process group), or not readable in this torch
                continue
            for name, member in torch.distributed.ReduceOp.RedOpType.__members__.items():
                if int(member) == int(value):
                    return name
    return None


def _sums(tensors: list[torch.Tensor]) -> tuple[float, float, float]:
    """Sum, sum of |x| and an order-sensitive checksum, all in float64."""
    total = absolute = weighted = 0.0
    for t in tensors:
        x = t.detach().to("cpu", torch.float64).flatten()
        total += float(x.sum())
        absolute += float(x.abs().sum())
        weighted += float((x * torch.linspace(1.0, 2.0, x.numel(), dtype=torch.float64)).sum()) if x.numel() else 0.0
    return total, absolute, weighted


def _tensors(x) -> list[torch.Tensor]:
    return [t for t in tree_leaves(x) if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex())]


def inputs_stats(op: str, args) -> dict:
    """What a collective's inputs were, taken before it ran (in-place collectives overwrite them)."""
    if op == "c10d::allgather_" or op == "c10d::_allgather_base_":
        return dict(zip(("in_sum", "in_abs", "in_check"), _sums(_tensors(args[1]))))
    return dict(zip(("in_sum", "in_abs", "in_check"), _sums(_tensors(args[0]))))


def outputs_stats(op: str, args, out) -> dict:
    tensors = _tensors(out[0] if isinstance(out, (tuple, list)) and out and op.startswith("c10d::") else out)
    stats = dict(zip(("out_sum", "out_abs", "out_check"), _sums(tensors)))
    if op == "c10d::allgather_":  # per gathered piece: piece j must be rank j's input
        stats["piece_sums"] = [_sums(_tensors(p))[0] for p in (out[0][0] if out and out[0] else [])]
    stats["reduce_op"] = reduce_op_name(args) if op in ALL_REDUCE or op.startswith("c10d::allreduce") else None
    return stats


def _close(x: float, y: float, scale: float) -> bool:
    return math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-6 * max(scale, 1e-30))


def check_across_ranks(per_rank: dict[int, list[dict]]) -> list[dict]:
    """One row per collective call (the k-th collective of each rank): pass or fail, and why."""
    ranks = sorted(per_rank)
    rows = []
    n = min(len(v) for v in per_rank.values()) if per_rank else 0
    if per_rank and len({len(v) for v in per_rank.values()}) > 1:
        rows.append({"op": "collectives", "status": "fail", "rule": "collective",
                     "detail": f"ranks ran different numbers of collectives: "
                               f"{ {r: len(per_rank[r]) for r in ranks} }"})
    for k in range(n):
        calls = [per_rank[r][k] for r in ranks]
        first = calls[0]
        row = {key: first.get(key) for key in ("index", "op", "phase", "module", "step")}
        row.update(rank=None, rule="collective", status="pass", detail="same result on every rank")
        if len({c["op"] for c in calls}) > 1:
            row.update(status="fail", detail=f"ranks ran different collectives here: {[c['op'] for c in calls]}")
        elif first["op"] in SAME_EVERYWHERE:
            scale = max(c["out_abs"] for c in calls)
            if not all(_close(c["out_check"], first["out_check"], scale) for c in calls):
                row.update(status="fail", detail=f"results differ across ranks (checksums "
                                                 f"{[c['out_check'] for c in calls]})")
            elif first["op"] in ALL_REDUCE and first.get("reduce_op") in ("SUM", "AVG"):
                expected = sum(c["in_sum"] for c in calls) / (len(calls) if first["reduce_op"] == "AVG" else 1)
                in_scale = sum(c["in_abs"] for c in calls)
                if not _close(first["out_sum"], expected, in_scale):
                    row.update(status="fail", detail=f"{first['reduce_op']} result sums to {first['out_sum']:.9g}, "
                                                     f"the ranks' inputs to {expected:.9g}")
                else:
                    row["detail"] = f"same result on every rank, equal to the {first['reduce_op']} of the inputs"
            elif first["op"] == "c10d::allgather_" and first.get("piece_sums"):
                want = [c["in_sum"] for c in calls]
                if not all(_close(x, y, max(c["in_abs"] for c in calls)) for x, y in zip(first["piece_sums"], want)):
                    row.update(status="fail", detail=f"gathered pieces sum to {first['piece_sums']}, inputs to {want}")
        else:
            row.update(status="skipped", rule="skipped", detail="no cross-rank invariant known for this collective")
        rows.append(row)
    return rows


_ROUND = 0


def exchange(records: list[dict], rank: int, timeout_s: float = 60.0) -> dict[int, list[dict]] | None:
    """Every rank's collective records, through the default group's store (no collective is
    issued); None when there is no initialised default group."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return None
    global _ROUND
    _ROUND += 1  # one key space per exchange: every rank's tools exchange in the same order
    store = dist.distributed_c10d._get_default_store()
    world = dist.get_world_size()
    store.set(f"ditorch_precision/collectives/{_ROUND}/{rank}", json.dumps(records))
    keys = [f"ditorch_precision/collectives/{_ROUND}/{r}" for r in range(world)]
    store.wait(keys, timedelta(seconds=timeout_s))
    return {r: json.loads(store.get(k)) for r, k in enumerate(keys)}


def stats_from_capture(rec: dict, data: dict | None) -> dict | None:
    """The cross-rank check's record of one captured collective (inputs as saved before it ran,
    outputs after it completed), or None without saved tensors."""
    if data is None:
        return None
    stats = {k: rec.get(k) for k in ("index", "op", "phase", "module", "step")}
    stats.update(inputs_stats(rec["op"], data["args"]))
    stats.update(outputs_stats(rec["op"], data["args"], data["outputs"]))
    stats["reduce_op"] = rec.get("reduce_op")
    return stats
