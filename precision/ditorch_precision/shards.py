"""A tensor-parallel run against a run of one rank (TP N against TP 1 of the same model).

Rank against rank, the ops inside a tensor-parallel layer have other shapes (each rank computes a
slice of the projection, or a partial sum that an all-reduce completes), so they do not pair: their
modules become regions (ditorch_precision.align), where each rank's own ops are judged against their
float64 replay, and the regions' module records are compared with the reference's. Those records
are whole where the layer's output is (a row-parallel layer's, after its all-reduce) and a slice of
it where it is not (a column-parallel layer's output, its gradient, a sharded parameter): such a
record is gathered from every rank's same record, concatenated in rank order along the one
dimension whose size differs from the reference's, before it is compared.

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


def _concatenated(slices: list, whole: torch.Size, own: torch.Tensor) -> torch.Tensor:
    """The slices joined along the one dimension where they differ from ``whole``, if they add up
    to it; else ``own`` (the compare then reports the shapes)."""
    if any(s is None or s.dim() != len(whole) for s in slices):
        return own
    dims = {d for s in slices for d in range(len(whole)) if s.shape[d] != whole[d]}
    if len(dims) != 1:
        return own
    (d,) = dims
    if sum(s.shape[d] for s in slices) != whole[d] or any(s.dtype != own.dtype for s in slices):
        return own
    return torch.cat(slices, dim=d)
