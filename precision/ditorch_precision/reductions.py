"""Cross-rank invariants of MAX, MIN and PRODUCT all-reduces, which no sum can check: each rank
measures its own input against the result (the same on every rank, checked by checksum), and the
check combines these local counts.

MAX (MIN): no rank's input is above (below) the result anywhere, and every element of the result
equals some rank's input: each rank sends the bit mask of the elements its input does not reach,
and no element may be in every rank's mask (exact at any size; whether sets held by different ranks
are disjoint cannot be decided from less than a bit per element).
PRODUCT: where the result is finite no rank's input is NaN or infinite; on its non-zero finite
elements no rank's input is zero, and on its normal ones (a subnormal keeps only a few significant
bits) the sum of log|input| over ranks equals the sum of log|result| (within the rounding of world - 1
products per element); the result's zeros are each some rank's zero (a bit mask per rank, as for
MAX); the result is negative exactly where an odd number of ranks' inputs are (XOR of the positions'
hashes, an exact test).

A reduce's result lives on its root and a reduce-scatter's piece r on rank r only: no other rank can
measure its input against it. For these (and for an integer PRODUCT, whose wrapped products have no
magnitude to compare) each rank sends its input's exact values (``encode``, any size, one part per
tensor so dtypes may differ), and the check measures every rank's input against the result the
same way (``check_values``); an integer PRODUCT is compared exactly with the product wrapped in its
dtype. Everything runs over pieces of ``CHUNK_ELEMENTS`` elements, so the memory a check takes
besides the records is a few pieces, whatever the tensors' size; the records themselves hold a bit
per element (masks) or the elements' bytes (values)."""
from __future__ import annotations

import base64
import math

import numpy as np
import torch
from torch.utils._pytree import tree_leaves

ELEMENTWISE = ("MAX", "MIN", "PRODUCT")
CHUNK_ELEMENTS = 1 << 16  # elements converted and compared at a time
_MASK_BYTES = CHUNK_ELEMENTS // 8  # one encoded string per this many bytes of mask
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # multiplicative hashing of element positions


def real_tensors(tree) -> list[torch.Tensor]:
    """The tensors of an all-reduce's argument, integer ones included (a MAX of flags, of counts)."""
    return [t for t in tree_leaves(tree) if isinstance(t, torch.Tensor) and not t.is_complex()]


class _Encoded:
    """One tensor of an ``encode`` record, decoded a piece at a time."""

    def __init__(self, dtype: torch.dtype, n: int, chunks: list[str]) -> None:
        self.dtype, self.n, self.chunks = dtype, n, chunks

    def numel(self) -> int:
        return self.n

    def is_floating_point(self) -> bool:
        return self.dtype.is_floating_point

    def pieces(self):
        for text in self.chunks:
            raw = bytearray(base64.b64decode(text, validate=True))
            if len(raw) % self.dtype.itemsize:
                raise ValueError(f"{len(raw)} bytes are not whole {self.dtype} elements")
            yield torch.frombuffer(raw, dtype=torch.uint8).view(self.dtype) if raw else torch.zeros(0, dtype=self.dtype)


def _pieces(tensors: list):
    """Flat pieces of at most ``CHUNK_ELEMENTS`` elements, in order, of tensors or ``_Encoded`` ones."""
    for t in tensors:
        if isinstance(t, _Encoded):
            yield from t.pieces()
            continue
        flat = t.detach().reshape(-1)
        for i in range(0, flat.numel(), CHUNK_ELEMENTS):
            yield flat[i:i + CHUNK_ELEMENTS].to("cpu")


def _paired(xs: list, ys: list):
    """(offset, x, y): aligned pieces of two sequences of the same total size, in their common dtype
    (the comparisons are exact: int64 values are not rounded through float64)."""
    it_x, it_y = _pieces(xs), _pieces(ys)
    x = y = torch.zeros(0)
    offset = 0
    while True:
        if not x.numel():
            x = next(it_x, None)
        if not y.numel():
            y = next(it_y, None)
        if x is None or y is None:
            return
        n = min(x.numel(), y.numel())
        if n:
            common = torch.promote_types(x.dtype, y.dtype)
            yield offset, x[:n].to(common), y[:n].to(common)
            offset += n
        x, y = x[n:], y[n:]


def _position_hash(mask: torch.Tensor, offset: int = 0) -> int:
    """XOR over the set positions (``offset`` + index) of a hash of each position: equal for two masks
    only if (up to hash collisions) they mark the same positions an odd number of times."""
    idx = torch.nonzero(mask).reshape(-1).numpy().astype(np.uint64) + np.uint64(offset + 1)
    with np.errstate(over="ignore"):
        return int(np.bitwise_xor.reduce(idx * _GOLDEN, initial=np.uint64(0)))


class _MaskWriter:
    """A bit mask written a piece at a time, as base64 strings of ``_MASK_BYTES`` bytes each."""

    def __init__(self) -> None:
        self.chunks: list[str] = []
        self._bits = np.zeros(0, dtype=bool)
        self._bytes = bytearray()

    def add(self, bits: np.ndarray) -> None:
        bits = np.concatenate([self._bits, bits])
        whole = len(bits) // 8 * 8
        self._bytes += np.packbits(bits[:whole]).tobytes()
        self._bits = bits[whole:]
        while len(self._bytes) >= _MASK_BYTES:
            self.chunks.append(base64.b64encode(bytes(self._bytes[:_MASK_BYTES])).decode())
            del self._bytes[:_MASK_BYTES]

    def close(self) -> list[str]:
        self._bytes += np.packbits(self._bits).tobytes()
        if self._bytes:
            self.chunks.append(base64.b64encode(bytes(self._bytes)).decode())
        return self.chunks


def _numel(tensors: list) -> int:
    return sum(t.numel() for t in tensors)


def local_stats(reduce_op: str, before: list, after: list) -> dict:
    """What one rank knows: its input (``before``) measured against the result (``after``); tensors,
    or ``decode``'s parts."""
    n = _numel(after)
    if _numel(before) != n:
        return {"elementwise": "input and result sizes differ"}
    if not before:
        return {"elementwise": "no tensors"}
    if reduce_op in ("MAX", "MIN"):
        stats = {"n_elements": n, "n_beyond": 0, "n_equal": 0}
        mask = _MaskWriter()
        for _, x, y in _paired(before, after):
            beyond = x > y if reduce_op == "MAX" else x < y
            equal = (x == y) | (torch.isnan(x) & torch.isnan(y))
            stats["n_beyond"] += int(beyond.sum())
            stats["n_equal"] += int(equal.sum())
            mask.add((~equal).numpy())
        stats["unreached"] = mask.close()
        return stats
    if not before[0].is_floating_point():  # an integer product wraps around: no magnitude to compare
        return {"elementwise": "integer PRODUCT"}
    eps = max(float(torch.finfo(t.dtype).eps) for t in before if t.is_floating_point())
    # A subnormal result keeps only a few significant bits: its magnitude is not held to eps.
    tiny = max((float(torch.finfo(t.dtype).tiny) for t in after if t.is_floating_point()), default=0.0)
    stats = {"n_elements": n, "n_live": 0, "eps": eps, "log_in": 0.0, "log_out": 0.0, "n_lost": 0,
             "n_nonfinite": 0, "n_zero": 0, "neg_in": 0, "neg_out": 0}
    zeros = _MaskWriter()  # the result's zeros this rank's input does not explain (it is not 0 there)
    for offset, x, y in _paired(before, after):
        x, y = x.double(), y.double()
        finite, zero_out, zero_in = torch.isfinite(y), y == 0, x == 0
        nonzero = finite & ~zero_out
        # a NaN or infinite input makes the product NaN or infinite: a finite result there is wrong
        # (and the NaN logarithm of a NaN input would silence the magnitude test of every element)
        stats["n_nonfinite"] += int((finite & ~torch.isfinite(x)).sum())
        normal = nonzero & (y.abs() >= tiny)
        stats["n_live"] += int(normal.sum())
        stats["log_in"] += float(torch.log(x[normal & ~zero_in].abs()).sum())
        stats["log_out"] += float(torch.log(y[normal].abs()).sum())
        stats["n_lost"] += int((nonzero & zero_in).sum())
        stats["n_zero"] += int(zero_out.sum())
        zeros.add((zero_out & ~zero_in).numpy())
        stats["neg_in"] ^= _position_hash(nonzero & (x < 0), offset)
        stats["neg_out"] ^= _position_hash(nonzero & (y < 0), offset)
    # Whether every zero of the result is some rank's zero takes a bit per element: a count of each
    # rank's zeros there is fooled by a zero several ranks share.
    stats["unexplained_zeros"] = zeros.close() if stats["n_zero"] else []
    return stats


def _nowhere(masks: list, n: int) -> tuple[int, int] | None:
    """(count, first position) of the elements set in every rank's mask (``local_stats``'
    "unreached" strings), piece by piece; None when the masks are malformed or of other sizes."""
    if len({len(m) for m in masks}) != 1:
        return None
    count, first, seen = 0, -1, 0
    for texts in zip(*masks):
        bits = [np.unpackbits(np.frombuffer(base64.b64decode(t), dtype=np.uint8)) for t in texts]
        if len({len(b) for b in bits}) != 1:
            return None
        both = np.logical_and.reduce(bits)[: max(n - seen, 0)]
        hits = np.flatnonzero(both)
        if len(hits) and first < 0:
            first = seen + int(hits[0])
        count += len(hits)
        seen += len(bits[0])
    return (count, first) if seen >= n else None


def _in_every_mask(calls: list[dict], key: str, n: int) -> tuple[int, int] | str:
    """``_nowhere`` of the ranks' masks under ``key``, or what is wrong with them."""
    masks = [c.get(key) for c in calls]
    if not all(isinstance(m, list) and all(isinstance(t, str) for t in m) for m in masks):
        return f"a rank sent no {key!r} mask"
    found = _nowhere(masks, n)
    return f"the ranks' {key!r} masks have different sizes" if found is None else found


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
        nowhere = _in_every_mask(calls, "unreached", n)
        if isinstance(nowhere, str):
            return "fail", nowhere
        if nowhere[0]:
            return "fail", (f"{nowhere[0]} elements of the {reduce_op} result equal no rank's input "
                            f"(the first: element {nowhere[1]})")
        return "pass", f"the result is the elementwise {reduce_op} of the inputs"
    for rank, c in zip(ranks, calls):
        if c.get("n_nonfinite"):
            return "fail", (f"rank {rank}'s input is NaN or infinite at {c['n_nonfinite']} elements where the "
                            f"PRODUCT result is finite")
        if c["n_lost"]:
            return "fail", f"the PRODUCT result is non-zero at {c['n_lost']} elements where rank {rank}'s input is 0"
    if calls[0]["n_zero"]:
        nowhere = _in_every_mask(calls, "unexplained_zeros", n)
        if isinstance(nowhere, str):
            return "fail", nowhere
        if nowhere[0]:
            return "fail", (f"the PRODUCT result is 0 at {nowhere[0]} elements where no rank's input is (the first: "
                            f"element {nowhere[1]}; a product that underflows is 0 too, which this check does not "
                            f"tell apart)")
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
    """The exact values of ``tensors``, one part per tensor (its dtype, element count and bytes in
    base64 strings of ``CHUNK_ELEMENTS`` elements each), or None without tensors (or with complex ones)."""
    if not tensors or any(t.is_complex() for t in tensors):
        return None
    parts = []
    for t in tensors:
        chunks = [base64.b64encode(piece.contiguous().view(torch.uint8).numpy().tobytes()).decode()
                  for piece in _pieces([t])]
        parts.append({"dtype": str(t.dtype).removeprefix("torch."), "n": t.numel(), "chunks": chunks})
    return {"parts": parts}


def decode(record) -> list[_Encoded] | None:
    """``encode``'s tensors, to be read a piece at a time, or None for a record that is not one
    (records are data: the pieces' sizes are checked as they are read)."""
    parts = record.get("parts") if isinstance(record, dict) else None
    if not isinstance(parts, list) or not parts:
        return None
    out = []
    for part in parts:
        if not isinstance(part, dict):
            return None
        dtype = getattr(torch, str(part.get("dtype")), None)
        n, chunks = part.get("n"), part.get("chunks")
        if (not isinstance(dtype, torch.dtype) or dtype.is_complex or not isinstance(n, int) or n < 0
                or not isinstance(chunks, list) or not all(isinstance(c, str) for c in chunks)):
            return None
        out.append(_Encoded(dtype, n, chunks))
    return out


def check_values(reduce_op: str, inputs: list, result, ranks: list[int]) -> tuple[str, str]:
    """(status, detail) of one elementwise reduction from every contributing rank's exact input
    (``encode`` records, in ``ranks`` order) and the result they must reduce to, tensor by tensor."""
    xs, y = [decode(x) for x in inputs], decode(result)
    if y is None or any(x is None for x in xs):
        return "skipped", f"{reduce_op} not checked elementwise: no values recorded"
    if any(len(x) != len(y) or any(a.numel() != b.numel() or a.dtype != b.dtype for a, b in zip(x, y)) for x in xs):
        return "fail", f"the ranks' inputs and the {reduce_op} result differ in size or dtype"
    try:
        for p, part in enumerate(y):
            status, detail = _check_part(reduce_op, [x[p] for x in xs], part, ranks)
            if status != "pass" or len(y) == 1:
                return status, detail if len(y) == 1 else f"tensor {p}: {detail}"
    except ValueError as exc:  # a value string that is not base64 of whole elements
        return "fail", f"a malformed values record: {exc}"
    return "pass", f"the result is the elementwise {reduce_op} of the inputs, for each of its {len(y)} tensors"


def _check_part(reduce_op: str, xs: list[_Encoded], y: _Encoded, ranks: list[int]) -> tuple[str, str]:
    if reduce_op == "PRODUCT" and not y.is_floating_point():  # exact: wraps around as the backend does
        n_wrong, first, offset = 0, None, 0
        for pieces in zip(y.pieces(), *(x.pieces() for x in xs)):
            got, want = pieces[0], pieces[1].clone()
            if any(q.numel() != got.numel() for q in pieces):
                raise ValueError("pieces of other sizes")
            for x in pieces[2:]:
                want.mul_(x)
            wrong = torch.nonzero(want != got).reshape(-1)
            if len(wrong) and first is None:
                i = int(wrong[0])
                first = (offset + i, int(got[i]), int(want[i]))
            n_wrong += len(wrong)
            offset += got.numel()
        if offset != y.numel():
            raise ValueError(f"{offset} elements where {y.numel()} were announced")
        if n_wrong:
            return "fail", (f"{n_wrong} elements of the integer PRODUCT result are not the inputs' product "
                            f"(the first: element {first[0]}, {first[1]} instead of {first[2]})")
        return "pass", "the result is the elementwise PRODUCT of the inputs (exact)"
    return check(reduce_op, [local_stats(reduce_op, [x], [y]) for x in xs], ranks)
