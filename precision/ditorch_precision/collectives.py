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

from . import reductions
from .point_to_point import check_transfers

# Collectives whose outputs must be the same on every rank of the group.
SAME_EVERYWHERE = ("c10d::allreduce_", "c10d::allgather_", "c10d::broadcast_", "c10d::allreduce_coalesced_",
                   "c10d::_allgather_base_", "_c10d_functional::all_reduce", "_c10d_functional::broadcast",
                   "_c10d_functional::all_gather_into_tensor")
ALL_REDUCE = ("c10d::allreduce_", "_c10d_functional::all_reduce")
_FUNCTIONAL = ("_c10d_functional::", "c10d_functional::")
# Functional-collective plumbing: waiting and autograd wrapping, no communication of their own.
PLUMBING = ("_c10d_functional::wait_tensor", "_c10d_functional::_wrap_tensor_autograd",
            "c10d_functional::wait_tensor")
# Point-to-point transfers are never waited for by a tool: gloo counts waits on a send/recv Work, so
# a second wait (the caller's own, after the tool's) waits for a transfer that never comes.
POINT_TO_POINT = ("c10d::send", "c10d::recv_", "c10d::recv_any_source_")


def is_collective(op: str) -> bool:
    return op.startswith("c10d::") or op.startswith(_FUNCTIONAL)


def wait_collective(out, op: str = "") -> None:
    """Wait for the collective to complete, so its outputs hold the result: the Work objects of a
    c10d op, ``wait_tensor`` on a functional collective's outputs (its own later wait is then a no-op)."""
    if op in POINT_TO_POINT:
        return
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
            if not work.is_completed():  # a second wait on gloo's send/recv waits for another transfer
                work.wait()


def group_ranks(op: str, args) -> list[int] | None:
    """The global ranks of the call's process group, in group-rank order: the pieces, roots and peers
    a call names are group ranks. None without an initialised process group."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return None
    if op.startswith(_FUNCTIONAL):  # the group's name is the last string argument
        name = next((a for a in reversed(args) if isinstance(a, str)), None)
        return ranks_by_name(name) if name is not None else None
    for a in args:
        if isinstance(a, torch.ScriptObject):
            try:
                pg = torch._C._distributed_c10d.ProcessGroup.unbox(a)
            except (RuntimeError, TypeError):  # a ReduceOp or other options object
                continue
            return _global_ranks(pg)
    return None


def ranks_by_name(name: str) -> list[int] | None:
    """The global ranks of the process group named ``name`` (``ProcessGroup.group_name``, as a
    functional collective names it), or None where this process knows no such group."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return None
    try:
        pg = dist.distributed_c10d._resolve_process_group(name)
    except (RuntimeError, ValueError, KeyError):
        return None
    return _global_ranks(pg)


def _global_ranks(pg) -> list[int] | None:
    try:
        return [torch.distributed.get_global_rank(pg, i) for i in range(pg.size())]
    except (RuntimeError, ValueError, KeyError):  # a group this process does not know
        return None


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
    """Every tensor (integer ones too: a SUM of token counts; float64 holds them exactly below 2**53)."""
    return [t for t in tree_leaves(x) if isinstance(t, torch.Tensor)]


# Collectives whose pieces move between ranks: per call, each piece's (sum, sum of |x|, checksum).
REDUCE_SCATTER = ("c10d::reduce_scatter_", "c10d::_reduce_scatter_base_", "_c10d_functional::reduce_scatter_tensor")
ALL_TO_ALL = ("c10d::alltoall_", "c10d::alltoall_base_", "_c10d_functional::all_to_all_single")
ROOTED = ("c10d::reduce_", "c10d::gather_", "c10d::scatter_")  # root rank at args[3]


def _split(t: torch.Tensor, sizes, world: int) -> list[torch.Tensor]:
    """A flat collective's pieces along dim 0: by ``sizes`` (the op's split sizes), else equal."""
    if sizes:
        return list(torch.split(t, list(sizes)))
    return list(torch.chunk(t, world)) if world and t.shape and t.shape[0] % world == 0 else [t]


def _pieces(op: str, tensors, sizes, world: int) -> list[tuple[float, float, float]]:
    if isinstance(tensors, torch.Tensor):
        return [_sums([p]) for p in _split(tensors, sizes, world)]
    return [_sums(_tensors(p)) for p in tensors]


def _by_values(op: str, reduce_op: str | None, tensors: list[torch.Tensor]) -> bool:
    """Whether the call is checked from its ranks' exact values (``reductions.check_values``): an
    elementwise reduce or reduce-scatter (its result is on one rank), an integer PRODUCT all-reduce."""
    if reduce_op not in reductions.ELEMENTWISE:
        return False
    if op in REDUCE_SCATTER or op == "c10d::reduce_":
        return True
    return op in ALL_REDUCE and reduce_op == "PRODUCT" and bool(tensors) and not tensors[0].is_floating_point()


def _input_values(op: str, args, world: int) -> list[dict | None]:
    """Per piece (one per group rank for a reduce-scatter, else one), the input's exact values."""
    if op == "c10d::reduce_scatter_":
        return [reductions.encode([t]) for t in (args[1][0] if args[1] else [])]
    if op in REDUCE_SCATTER:
        src = args[1] if op == "c10d::_reduce_scatter_base_" else args[0]
        return [reductions.encode([p]) for p in _split(src, None, world)]
    return [reductions.encode(reductions.real_tensors(args[0]))]


def inputs_stats(op: str, args, world: int = 0, reduce_op: str | None = None) -> dict:
    """What a collective's inputs were, taken before it ran (in-place collectives overwrite them).
    ``reduce_op``: where ``args`` no longer hold the ReduceOp (saved arguments)."""
    if op in ("c10d::allgather_", "c10d::_allgather_base_", "c10d::gather_", "c10d::scatter_"):
        src = args[1]
    elif op in REDUCE_SCATTER[:2] or op in ALL_TO_ALL[:2]:
        src = args[1]
    else:
        src = args[0]
    stats = dict(zip(("in_sum", "in_abs", "in_check"), _sums(_tensors(src))))
    if op == "c10d::reduce_scatter_" or op == "c10d::scatter_":
        stats["in_pieces"] = _pieces(op, args[1][0] if args[1] else [], None, world)
    elif op in ("c10d::_reduce_scatter_base_", "_c10d_functional::reduce_scatter_tensor"):
        stats["in_pieces"] = _pieces(op, src, None, world)
    elif op == "c10d::alltoall_":
        stats["in_pieces"] = _pieces(op, args[1], None, world)
    elif op == "c10d::alltoall_base_":
        stats["in_pieces"] = _pieces(op, args[1], args[4], world)
    elif op == "_c10d_functional::all_to_all_single":
        stats["in_pieces"] = _pieces(op, args[0], args[2], world)
    if op in ROOTED:
        stats["root"] = int(args[3])
    reducing = op in REDUCE_SCATTER or op in ALL_REDUCE or op == "c10d::reduce_"
    if reducing and _by_values(op, reduce_op or reduce_op_name(args), reductions.real_tensors(src)):
        stats["in_values"] = _input_values(op, args, world)
    return stats


def written(op: str, args, out):
    """What a collective wrote, once it completed: the c10d ops write their first argument (most
    return only a Work), the functional ones return their result."""
    return out if op.startswith(_FUNCTIONAL) else args[0]


def input_copy(op: str, args) -> list[torch.Tensor] | None:
    """For an all-reduce whose invariant compares each element with the inputs (MAX, MIN, PRODUCT),
    a copy of its input, kept until it completed (the c10d one overwrites it); else None."""
    if op in ALL_REDUCE and reduce_op_name(args) in reductions.ELEMENTWISE:
        return [t.detach().clone() for t in reductions.real_tensors(args[0])]
    return None


def outputs_stats(op: str, args, out, world: int = 0, before: list[torch.Tensor] | None = None,
                  reduce_op: str | None = None) -> dict:
    """``out``: what the collective wrote (``written``), after it completed; ``before``: a copy of
    its input where ``input_copy`` made one; ``reduce_op`` as for ``inputs_stats``."""
    stats = dict(zip(("out_sum", "out_abs", "out_check"), _sums(_tensors(out))))
    if op == "c10d::allgather_":  # per gathered piece: piece j must be rank j's input
        stats["piece_sums"] = [_sums(_tensors(p))[0] for p in (out[0] if out else [])]
    elif op == "c10d::gather_":
        stats["out_pieces"] = _pieces(op, out[0] if out else [], None, world)
    elif op == "c10d::alltoall_":
        stats["out_pieces"] = _pieces(op, out, None, world)
    elif op == "c10d::alltoall_base_":
        stats["out_pieces"] = _pieces(op, out, args[3], world)
    elif op == "_c10d_functional::all_to_all_single":
        stats["out_pieces"] = _pieces(op, out, args[1], world)
    reducing = op in ALL_REDUCE or op.startswith("c10d::allreduce") or op in REDUCE_SCATTER or op == "c10d::reduce_"
    stats["reduce_op"] = (reduce_op or reduce_op_name(args)) if reducing else None
    if _by_values(op, stats["reduce_op"], reductions.real_tensors(out)):
        stats["out_values"] = reductions.encode(reductions.real_tensors(out))
    if before is not None and stats["reduce_op"] in reductions.ELEMENTWISE:
        stats.update(reductions.local_stats(stats["reduce_op"], before, reductions.real_tensors(out)))
    return stats


def _close(x: float, y: float, scale: float) -> bool:
    return math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-6 * max(scale, 1e-30))


def _reduced(reduce_op: str | None, values: list[float], world: int) -> float | None:
    """What a SUM/AVG reduction of ``values`` must sum to; None for other reductions."""
    if reduce_op == "SUM":
        return sum(values)
    if reduce_op == "AVG":
        return sum(values) / world
    return None


def _check_call(calls: list[dict], ranks: list[int]) -> tuple[str, str]:
    """(status, detail) for the k-th collective of every rank (``calls`` in ``ranks`` order)."""
    first, world = calls[0], len(calls)
    op = first["op"]
    if len({c["op"] for c in calls}) > 1:
        return "fail", f"ranks ran different collectives here: {[c['op'] for c in calls]}"
    if op in SAME_EVERYWHERE:
        scale = max(c["out_abs"] for c in calls)
        if not all(_close(c["out_check"], first["out_check"], scale) for c in calls):
            return "fail", f"results differ across ranks (checksums {[c['out_check'] for c in calls]})"
        expected = _reduced(first.get("reduce_op"), [c["in_sum"] for c in calls], world)
        if op in ALL_REDUCE and expected is not None:
            if not _close(first["out_sum"], expected, sum(c["in_abs"] for c in calls)):
                return "fail", (f"{first['reduce_op']} result sums to {first['out_sum']:.9g}, "
                                f"the ranks' inputs to {expected:.9g}")
            return "pass", f"same result on every rank, equal to the {first['reduce_op']} of the inputs"
        if op in ALL_REDUCE and "out_values" in first:
            status, detail = _check_by_values(calls, 0, first, ranks)
            return status, detail if status == "fail" else f"same result on every rank; {detail}"
        if op in ALL_REDUCE and first.get("reduce_op") in reductions.ELEMENTWISE:
            status, detail = reductions.check(first["reduce_op"], calls, ranks)
            return status, detail if status == "fail" else f"same result on every rank; {detail}"
        if op == "c10d::allgather_" and first.get("piece_sums"):
            want = [c["in_sum"] for c in calls]
            if not all(_close(x, y, max(c["in_abs"] for c in calls)) for x, y in zip(first["piece_sums"], want)):
                return "fail", f"gathered pieces sum to {first['piece_sums']}, inputs to {want}"
        return "pass", "same result on every rank"
    if op in REDUCE_SCATTER and first.get("reduce_op") in reductions.ELEMENTWISE:
        for r, c in enumerate(calls):  # rank r's piece: the reduction of every rank's piece r
            status, detail = _check_by_values(calls, r, c, ranks)
            if status != "pass":
                return status, f"rank {ranks[r]}'s piece: {detail}"
        return "pass", f"each rank's piece is the elementwise {first['reduce_op']} of the ranks' pieces for it"
    if op in REDUCE_SCATTER:
        if any(len(c.get("in_pieces") or ()) != world for c in calls):
            return "skipped", "inputs not split into one piece per rank"
        for r, c in enumerate(calls):  # rank r's result: the reduction of every rank's piece r
            expected = _reduced(first.get("reduce_op"), [d["in_pieces"][r][0] for d in calls], world)
            if expected is None:
                return "skipped", f"no sum invariant for a {first.get('reduce_op')} reduce-scatter"
            if not _close(c["out_sum"], expected, sum(d["in_pieces"][r][1] for d in calls)):
                return "fail", (f"rank {ranks[r]}'s piece sums to {c['out_sum']:.9g}, the {first['reduce_op']} of the "
                                f"ranks' pieces {r} to {expected:.9g}")
        return "pass", f"each rank's piece equals the {first['reduce_op']} of the ranks' pieces for it"
    if op in ALL_TO_ALL:
        if any(len(c.get("in_pieces") or ()) != world or len(c.get("out_pieces") or ()) != world for c in calls):
            return "skipped", "not one piece per rank"
        for r, c in enumerate(calls):  # rank r's piece j is rank j's piece r
            for j, d in enumerate(calls):
                got, sent = c["out_pieces"][j], d["in_pieces"][r]
                if not _close(got[2], sent[2], max(got[1], sent[1])):
                    return "fail", f"rank {ranks[r]} received from rank {ranks[j]} a piece other than the one sent"
        return "pass", "every piece arrived where it was sent, unchanged"
    if op in ROOTED:
        root = first.get("root")  # a group rank
        if not isinstance(root, int) or not 0 <= root < world or len({c.get("root") for c in calls}) > 1:
            return "fail", f"ranks named different roots: {[c.get('root') for c in calls]}"
        at_root = calls[root]
        if op == "c10d::reduce_" and first.get("reduce_op") in reductions.ELEMENTWISE:
            status, detail = _check_by_values(calls, 0, at_root, ranks)
            return status, f"the result at the root, rank {ranks[root]}: {detail}"
        if op == "c10d::reduce_":
            expected = _reduced(first.get("reduce_op"), [c["in_sum"] for c in calls], world)
            if expected is None:
                return "skipped", f"no sum invariant for a {first.get('reduce_op')} reduce"
            if not _close(at_root["out_sum"], expected, sum(c["in_abs"] for c in calls)):
                return "fail", (f"the result at the root, rank {ranks[root]}, sums to {at_root['out_sum']:.9g}, "
                                f"the ranks' inputs to {expected:.9g}")
            return "pass", f"the root's result is the {first['reduce_op']} of the inputs"
        if op == "c10d::gather_":
            pieces = at_root.get("out_pieces") or []
            if len(pieces) != world or not all(_close(p[2], c["in_check"], c["in_abs"]) for p, c in zip(pieces, calls)):
                return "fail", f"the pieces gathered at the root, rank {ranks[root]}, are not the ranks' inputs"
            return "pass", "the root holds every rank's input, in rank order"
        pieces = at_root.get("in_pieces") or []  # scatter: rank j receives the root's piece j
        if len(pieces) != world or not all(_close(c["out_check"], p[2], p[1]) for p, c in zip(pieces, calls)):
            return "fail", "a rank received another piece than the root's piece for it"
        return "pass", "every rank received the root's piece for it"
    return "skipped", "no cross-rank invariant known for this collective"


def _check_by_values(calls: list[dict], piece: int, holder: dict, ranks: list[int]) -> tuple[str, str]:
    """The elementwise check of ``holder``'s result against every rank's input piece ``piece``."""
    def value(c: dict):
        pieces = c.get("in_values")
        return pieces[piece] if isinstance(pieces, list) and 0 <= piece < len(pieces) else None
    return reductions.check_values(calls[0]["reduce_op"], [value(c) for c in calls], holder.get("out_values"), ranks)


def check_across_ranks(per_rank: dict[int, list[dict]]) -> list[dict]:
    """One row per collective call (the k-th call of each member of its process group): pass or fail,
    and why; then one row per point-to-point transfer (``point_to_point.check_transfers``). A record
    without a group is taken as a call of the whole job."""
    ranks = sorted(per_rank)
    rows = []
    groups: dict[tuple, dict[int, list[dict]]] = {}  # (members in group-rank order) -> member -> its calls
    for r in ranks:
        for c in per_rank[r]:
            if c["op"] not in POINT_TO_POINT:
                groups.setdefault(tuple(c.get("group") or ranks), {}).setdefault(r, []).append(c)
    for members, calls_of in groups.items():
        counts = {m: len(calls_of.get(m, [])) for m in members}
        if len(set(counts.values())) > 1:
            rows.append({"op": "collectives", "status": "fail", "rule": "collective", "rank": None,
                         "group": list(members), "detail": f"ranks ran different numbers of collectives in the "
                                                           f"group of ranks {list(members)}: {counts}"})
        for k in range(min(counts.values())):
            calls = [calls_of[m][k] for m in members]
            row = {key: calls[0].get(key) for key in ("index", "op", "phase", "module", "step")}
            status, detail = _check_call(calls, list(members))
            row.update(rank=None, group=list(members), rule="skipped" if status == "skipped" else "collective",
                       status=status, detail=detail)
            rows.append(row)
    return rows + check_transfers({r: [c for c in per_rank[r] if c["op"] in POINT_TO_POINT] for r in ranks})


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


def stats_from_capture(rec: dict, data: dict | None, world: int = 0) -> dict | None:
    """The cross-rank check's record of one captured collective (inputs as saved before it ran,
    outputs after it completed), or None without saved tensors. Point-to-point transfers have their
    own records (``point_to_point.load_transfers``)."""
    if data is None or rec["op"] in POINT_TO_POINT:
        return None
    stats = {k: rec.get(k) for k in ("index", "op", "phase", "module", "step", "group")}
    world = len(rec.get("group") or ()) or world
    stats.update(inputs_stats(rec["op"], data["args"], world, rec.get("reduce_op")))
    out = data["outputs"]  # a c10d op's written tensors come first (Capture saves them with the Work)
    out = out if rec["op"].startswith(_FUNCTIONAL) else out[0]
    stats.update(outputs_stats(rec["op"], data["args"], out, world, reduce_op=rec.get("reduce_op")))
    stats["reduce_op"] = rec.get("reduce_op")  # the saved arguments do not hold the ReduceOp object
    if rec["op"] in ALL_REDUCE and stats["reduce_op"] in reductions.ELEMENTWISE:  # the input as saved before it ran
        stats.update(reductions.local_stats(stats["reduce_op"], reductions.real_tensors(data["args"][0]),
                                            reductions.real_tensors(out)))
    return stats
