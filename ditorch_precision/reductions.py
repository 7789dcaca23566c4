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
of ranks' inputs are (XOR of the positions' hashes, an exact test)."""
from __future__ import annotations

import base64
import math

import numpy as np
import torch
from torch.utils._pytree import tree_leaves

ELEMENTWISE = ("MAX", "MIN", "PRODUCT")
EXACT_ELEMENTS = 1 << 16  # 8 KiB of mask per rank and call
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
