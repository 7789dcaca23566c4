"""Cross-rank invariants of MAX, MIN and PRODUCT all-reduces, which no sum can check: each rank
measures its own input against the result (the same on every rank, checked by checksum), and the
check combines these local counts.

MAX (MIN): no rank's input is above (below) the result anywhere, and every element of the result
equals some rank's input. Up to ``EXACT_ELEMENTS`` elements each rank sends the bit mask of the
elements its input does not reach, and no element may be in every rank's mask (exact; whether sets
held by different ranks are disjoint cannot be decided from less than a bit per element). Above it,
the ranks' counts of elements equal to the result must add up to at least the element count (a tie
between ranks elsewhere can hide one wrong element).
PRODUCT: on the result's non-zero finite elements, the sum of log|input| over ranks equals the sum of
log|result| (within the rounding of world - 1 products per element), no rank's input is zero there,
the result's zeros are each some rank's zero, and the result is negative exactly where an odd number
of ranks' inputs are (XOR of the positions' hashes, an exact test).

A reduce's result lives on its root and a reduce-scatter's piece r on rank r only: no other rank can
measure its input against it. For these (and for an integer PRODUCT, whose wrapped products have no
magnitude to compare), up to ``VALUE_ELEMENTS`` elements per call each rank sends its input's exact
values (``encode``), and the check measures every rank's input against the result the same way
(``check_values``); an integer PRODUCT is compared exactly with the product wrapped in its dtype."""
from __future__ import annotations

import base64
import math

import numpy as np
import torch
from torch.utils._pytree import tree_leaves

ELEMENTWISE = ("MAX", "MIN", "PRODUCT")
EXACT_ELEMENTS = 1 << 16  # 8 KiB of mask per rank and call
VALUE_ELEMENTS = 1 << 14  # 64 KiB of float32 values per rank and call through the store
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # multiplicative hashing of element positions


def real_tensors(tree) -> list[torch.Tensor]:
    """The tensors of an all-reduce's argument, integer ones included (a MAX of flags, of counts)."""
    return [t for t in tree_leaves(tree) if isinstance(t, torch.Tensor) and not t.is_complex()]


def _flat(tensors: list[torch.Tensor]) -> torch.Tensor:
    if not tensors:
        return torch.zeros(0, dtype=torch.float64)
    return torch.cat([t.detach().to("cpu", torch.float64).reshape(-1) for t in tensors])


def _position_hash(mask: torch.Tensor) -> int:
    """XOR over the set positions of a hash of each position: equal for two masks only if (up to
    hash collisions) they mark the same positions an odd number of times."""
    idx = torch.nonzero(mask).reshape(-1).numpy().astype(np.uint64) + np.uint64(1)
    with np.errstate(over="ignore"):
        return int(np.bitwise_xor.reduce(idx * _GOLDEN, initial=np.uint64(0)))


def local_stats(reduce_op: str, before: list[torch.Tensor], after: list[torch.Tensor]) -> dict:
    """What one rank knows: its input (``before``) measured against the result (``after``)."""
    x, y = _flat(before), _flat(after)
    if x.numel() != y.numel():
        return {"elementwise": "input and result sizes differ"}
    if not before:
        return {"elementwise": "no tensors"}
    eps = float(torch.finfo(before[0].dtype).eps) if before and before[0].is_floating_point() else 0.0
    if reduce_op in ("MAX", "MIN"):
        beyond = x > y if reduce_op == "MAX" else x < y
        equal = (x == y) | (torch.isnan(x) & torch.isnan(y))
        stats = {"n_elements": y.numel(), "n_beyond": int(beyond.sum()), "n_equal": int(equal.sum())}
        if y.numel() <= EXACT_ELEMENTS:
            stats["unreached"] = base64.b64encode(np.packbits((~equal).numpy()).tobytes()).decode()
        return stats
    if not before[0].is_floating_point():  # an integer product wraps around: no magnitude to compare
        return {"elementwise": "integer PRODUCT"}
    live = (y != 0) & torch.isfinite(y)
    zero_in = x == 0
    return {"n_elements": y.numel(), "n_live": int(live.sum()), "eps": eps,
            "log_in": float(torch.log(x[live & ~zero_in].abs()).sum()),
            "log_out": float(torch.log(y[live].abs()).sum()),
            "n_lost": int((live & zero_in).sum()), "zero_hits": int((zero_in & (y == 0)).sum()),
            "n_zero": int((y == 0).sum()), "neg_in": _position_hash(live & (x < 0)),
            "neg_out": _position_hash(live & (y < 0))}


def check(reduce_op: str, calls: list[dict], ranks: list[int]) -> tuple[str, str]:
    """(status, detail) of one all-reduce from every rank's ``local_stats`` (``calls`` in group order)."""
    if any("n_elements" not in c for c in calls):
        why = next((c["elementwise"] for c in calls if "elementwise" in c), "no elementwise record")
        return "skipped", f"{reduce_op} all-reduce not checked elementwise: {why}"
    n = calls[0]["n_elements"]
    if reduce_op in ("MAX", "MIN"):
        side = "above" if reduce_op == "MAX" else "below"
        for rank, c in zip(ranks, calls):
            if c["n_beyond"]:
                return "fail", f"rank {rank}'s input is {side} the {reduce_op} result at {c['n_beyond']} elements"
        if all(isinstance(c.get("unreached"), str) for c in calls):
            masks = [np.unpackbits(np.frombuffer(base64.b64decode(c["unreached"]), dtype=np.uint8))[:n]
                     for c in calls]
            nowhere = np.flatnonzero(np.logical_and.reduce(masks)) if all(len(m) == n for m in masks) else None
            if nowhere is None:
                return "fail", "the ranks' element masks have different sizes"
            if len(nowhere):
                return "fail", (f"{len(nowhere)} elements of the {reduce_op} result equal no rank's input "
                                f"(the first: element {int(nowhere[0])})")
            return "pass", f"the result is the elementwise {reduce_op} of the inputs"
        covered = sum(c["n_equal"] for c in calls)
        if covered < n:
            return "fail", f"{n - covered} or more elements of the {reduce_op} result equal no rank's input"
        return "pass", f"the result is the elementwise {reduce_op} of the inputs"
    for rank, c in zip(ranks, calls):
        if c["n_lost"]:
            return "fail", f"the PRODUCT result is non-zero at {c['n_lost']} elements where rank {rank}'s input is 0"
    if sum(c["zero_hits"] for c in calls) < calls[0]["n_zero"]:
        return "fail", "the PRODUCT result is 0 where no rank's input is"
    parity = 0
    for c in calls:
        parity ^= c["neg_in"]
    if parity != calls[0]["neg_out"]:
        return "fail", "the PRODUCT result's signs are not those of the inputs' product"
    log_in, log_out = sum(c["log_in"] for c in calls), calls[0]["log_out"]
    # Each element's product rounds world - 1 times: a relative error of eps/2 each, random in sign.
    tol = 8 * math.sqrt(max(calls[0]["n_live"], 1)) * len(calls) * max(c["eps"] for c in calls) + 1e-12 * abs(log_out)
    if abs(log_in - log_out) > tol:
        return "fail", (f"the PRODUCT result's magnitudes do not match the inputs': sum of log|x| {log_out:.9g}, "
                        f"of the inputs {log_in:.9g} (tolerance {tol:.3g})")
    return "pass", "the result is the elementwise PRODUCT of the inputs"


def encode(tensors: list[torch.Tensor]) -> dict | None:
    """The exact values of ``tensors`` (flattened, one dtype), or None above ``VALUE_ELEMENTS`` elements
    or with mixed dtypes."""
    if not tensors or len({t.dtype for t in tensors}) > 1 or sum(t.numel() for t in tensors) > VALUE_ELEMENTS:
        return None
    flat = torch.cat([t.detach().to("cpu").reshape(-1) for t in tensors])
    return {"dtype": str(flat.dtype).removeprefix("torch."),
            "values": base64.b64encode(flat.contiguous().view(torch.uint8).numpy().tobytes()).decode()}


def decode(record) -> torch.Tensor | None:
    """``encode``'s tensor, or None for a record that is not one (records are data)."""
    if not isinstance(record, dict) or not isinstance(record.get("values"), str):
        return None
    dtype = getattr(torch, str(record.get("dtype")), None)
    if not isinstance(dtype, torch.dtype) or dtype.is_complex:
        return None
    raw = bytearray(base64.b64decode(record["values"]))
    if len(raw) % dtype.itemsize:
        return None
    return torch.frombuffer(raw, dtype=torch.uint8).view(dtype) if raw else torch.zeros(0, dtype=dtype)


def check_values(reduce_op: str, inputs: list, result, ranks: list[int]) -> tuple[str, str]:
    """(status, detail) of one elementwise reduction from every contributing rank's exact input
    (``encode`` records, in ``ranks`` order) and the result they must reduce to."""
    xs, y = [decode(x) for x in inputs], decode(result)
    if y is None or any(x is None for x in xs):
        return "skipped", (f"{reduce_op} not checked elementwise: more than {VALUE_ELEMENTS} elements, "
                           f"mixed dtypes or no values recorded")
    if any(x.numel() != y.numel() or x.dtype != y.dtype for x in xs):
        return "fail", f"the ranks' inputs and the {reduce_op} result differ in size or dtype"
    if reduce_op == "PRODUCT" and not y.is_floating_point():  # exact: wraps around as the backend does
        want = xs[0].clone()
        for x in xs[1:]:
            want.mul_(x)
        wrong = torch.nonzero(want != y).reshape(-1)
        if len(wrong):
            i = int(wrong[0])
            return "fail", (f"{len(wrong)} elements of the integer PRODUCT result are not the inputs' product "
                            f"(the first: element {i}, {int(y[i])} instead of {int(want[i])})")
        return "pass", "the result is the elementwise PRODUCT of the inputs (exact)"
    return check(reduce_op, [local_stats(reduce_op, [x], [y]) for x in xs], ranks)
