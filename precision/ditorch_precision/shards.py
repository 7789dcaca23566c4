"""A tensor-parallel run against a run of one rank (TP N against TP 1 of the same model).

Rank against rank, the ops inside a tensor-parallel layer have other shapes (each rank computes a
slice of the projection, or a partial sum that an all-reduce completes), so they do not pair: their
modules become regions (ditorch_precision.align), where each rank's own ops are judged against their
float64 replay, and the regions' module records are compared with the reference's. Those records
are whole where the layer's output is (a row-parallel layer's, after its all-reduce) and a slice of
it where it is not (a column-parallel layer's output, its gradient, a sharded parameter): such a
record is gathered from every rank's same record, concatenated in rank order along the one
dimension whose size differs from the reference's, before it is compared.

A stats capture's slice records (a module's, or an unmatched op's in a region) take the statistics of
every rank's slices joined (TPShards.gather_stats), which are exactly the whole tensor's.

Not covered: a slice some ranks hold twice (key/value heads replicated when the TP size exceeds
their count), and partial sums recorded before their all-reduce (no module returns one here)."""
from __future__ import annotations

from collections import Counter

import torch

from .dump import Dump
from .metrics import tensor_leaves


def _identity(rec: dict) -> tuple:
    return rec.get("index"), rec["op"], rec.get("module"), rec.get("phase"), rec.get("step")


class TPShards:
    """The module records of the run under test's ranks (``dumps``, one TP group in rank order);
    ``rank``: the position in it of the capture being compared."""

    def __init__(self, dumps: list[Dump], rank: int) -> None:
        self.dumps, self.rank = dumps, rank
        self._by_key: list[dict | None] = [None] * len(dumps)  # (step, phase, module, op, n-th) -> record
        self._keys: dict[tuple, tuple] = {}  # this rank's records: identity -> key
        self._ops: list[dict | None] = [None] * len(dumps)  # stats captures: (index, op) -> op record

    def _index(self, k: int) -> dict:
        found = self._by_key[k]
        if found is None:  # module records only: a fraction of the ops, held for the compare's length
            found, seen = {}, Counter()
            for rec in self.dumps[k].iter_records():
                if rec.get("kind") == "module":
                    key = (rec.get("step"), rec.get("phase"), rec.get("module"), rec["op"])
                    found[(*key, seen[key])] = rec
                    if k == self.rank:
                        self._keys[_identity(rec)] = (*key, seen[key])
                    seen[key] += 1
            self._by_key[k] = found
        return found

    def gather(self, rec: dict, outputs: list, reference: list) -> list:
        """``rec``'s tensors (this rank's), each whose shape differs from the reference's at its
        place replaced by the concatenation of every rank's; left as they are where the ranks'
        slices do not add up to the reference's shape."""
        if all(x.shape == y.shape for x, y in zip(outputs, reference)):
            return outputs
        self._index(self.rank)
        key = self._keys.get(_identity(rec))
        if key is None:
            return outputs
        peers = []
        for k, dump in enumerate(self.dumps):
            other = self._index(k).get(key)
            data = dump.load(other) if other is not None else None
            if data is None:
                return outputs
            peers.append(tensor_leaves(data["outputs"]))
        out = list(outputs)
        for i, (x, y) in enumerate(zip(outputs, reference)):
            if x.shape != y.shape:
                out[i] = _concatenated([p[i] if i < len(p) else None for p in peers], y.shape, x)
        return out

    def gather_stats(self, rec: dict, reference: dict) -> dict:
        """A stats capture's module or op record ``rec`` (this rank's) with each output whose shape differs from
        the ``reference`` record's at its place given the statistics of every rank's slices joined (the
        least minimum, the greatest maximum, the mean of all elements, the root of the squared norms' sum:
        exactly the whole tensor's); as it is where the slices do not add up to the reference's shape."""
        shapes = [[tuple(o.get("shape") or ()) for o in r.get("outputs") or [] if isinstance(o, dict)]
                  for r in (rec, reference)]
        differ = [i for i, (x, y) in enumerate(zip(*shapes)) if x != y]
        if not differ or not isinstance(rec.get("stats"), list):
            return rec
        peers = self._peers(rec)
        if not peers or any(p is None or not isinstance(p.get("stats"), list) for p in peers):
            return rec
        stats = list(rec["stats"])
        for i in differ:
            parts = [(tuple((p.get("outputs") or [{}])[i].get("shape") or ()) if i < len(p.get("outputs") or [])
                      else None, p["stats"][i] if i < len(p["stats"]) else None) for p in peers]
            if i < len(stats) and _slice_dim(tuple(shapes[1][i]), [shape for shape, _ in parts]) is not None:
                stats[i] = _joined_stats([st for _, st in parts])
        return {**rec, "stats": stats}

    def _peers(self, rec: dict) -> list:
        """Every rank's record of ``rec``: a module record's by its key, an op's by its call (the ranks of
        a TP group run the same ops: the same index and op)."""
        if rec.get("kind") == "module":
            self._index(self.rank)
            key = self._keys.get(_identity(rec))
            return [self._index(k).get(key) for k in range(len(self.dumps))] if key is not None else []
        peers = []
        for k, dump in enumerate(self.dumps):
            if self._ops[k] is None:  # a stats capture's index lines only: no tensors held
                self._ops[k] = {(r.get("index"), r["op"]): r for r in dump.iter_records()
                                if r.get("kind", "op") == "op" and "stats" in r}
            peers.append(self._ops[k].get((rec.get("index"), rec["op"])))
        return peers


def _slice_dim(whole: tuple, shapes: list) -> int | None:
    """The one dimension along which ``shapes`` join into ``whole``, or None where they do not."""
    if any(s is None or len(s) != len(whole) for s in shapes):
        return None
    dims = {d for s in shapes for d in range(len(whole)) if s[d] != whole[d]}
    if len(dims) != 1:
        return None
    (d,) = dims
    return d if sum(s[d] for s in shapes) == whole[d] else None


def _joined_stats(parts: list) -> dict:
    """The statistics of a tensor from those of its slices (summaries.tensor_stats' fields)."""
    if any(not isinstance(p, dict) for p in parts):
        return {}
    out = {"dtype": parts[0].get("dtype"), "numel": sum(p.get("numel", 0) for p in parts)}
    if any("nan" not in p for p in parts):
        return out
    out["nan"], out["inf"] = sum(p["nan"] for p in parts), sum(p["inf"] for p in parts)
    finite = [p for p in parts if "min" in p]
    if finite:
        counts = [p["numel"] - p["nan"] - p["inf"] for p in finite]
        out.update(min=min(p["min"] for p in finite), max=max(p["max"] for p in finite),
                   mean=sum(p["mean"] * n for p, n in zip(finite, counts)) / max(sum(counts), 1),
                   norm=sum(p["norm"] ** 2 for p in finite) ** 0.5)
    return out


def _concatenated(slices: list, whole: torch.Size, own: torch.Tensor) -> torch.Tensor:
    """The slices joined along the one dimension where they differ from ``whole``, if they add up
    to it; else ``own`` (the compare then reports the shapes)."""
    d = _slice_dim(tuple(whole), [None if s is None else tuple(s.shape) for s in slices])
    if d is None or any(s.dtype != own.dtype for s in slices):
        return own
    return torch.cat(slices, dim=d)
