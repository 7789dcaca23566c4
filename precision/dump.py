"""The capture format: DIR/meta.json, DIR/index.jsonl (one record per op), DIR/tensors/NNNNNN.pt
(inputs and outputs of one op, saved with torch.save). Version 2 (``bulk``): DIR/tensors/partNNNNN.pt
holds many ops (a step's, usually), each under its record's ``key``; a tensor several of them read
is stored once."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_leaves, tree_map

FORMAT = "precision-capture"
VERSION = 1
INDEX = "index.jsonl"
META = "meta.json"


class DumpError(ValueError):
    """A capture directory that cannot be read; the message names the file."""


def tensor_meta(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return {"shape": list(x.shape), "dtype": str(x.dtype).removeprefix("torch."), "device": str(x.device)}
    return None


def tensors_meta(tree) -> list:
    return [tensor_meta(t) for t in tree_leaves(tree) if isinstance(t, torch.Tensor)]


@dataclass(frozen=True)
class TorchConstant:
    """A torch.memory_format or torch.layout, which torch.save cannot pickle, by name."""

    kind: str
    name: str

    def value(self):
        return getattr(torch, self.name)


@dataclass(frozen=True)
class Unsaved:
    """An argument that cannot be saved (e.g. a script object); replaying such an op fails clearly."""

    text: str


_PLAIN = (int, float, bool, str, complex, type(None), torch.dtype, torch.device, slice, type(Ellipsis))


def _saveable(x):
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu", copy=True).contiguous()  # compact: a view would save its whole storage
    if isinstance(x, (torch.memory_format, torch.layout)):
        return TorchConstant(type(x).__name__, str(x).removeprefix("torch."))
    return x if isinstance(x, _PLAIN) else Unsaved(repr(x)[:200])


def snapshot(tree):
    """Compact CPU copies of every tensor; other arguments in a form torch.save can write."""
    return tree_map(_saveable, tree)


def _compact(t: torch.Tensor) -> bool:
    # Saving a tensor writes its whole storage: fine when the tensor covers exactly that storage.
    return (t.device.type == "cpu" and t.storage_offset() == 0 and t.layout == torch.strided
            and t.untyped_storage().nbytes() == t.numel() * t.element_size() and not t.is_conj() and not t.is_neg())


def saveable_now(tree):
    """Like ``snapshot``, but compact CPU tensors are not copied: only for a ``torch.save`` done
    before anything can change them (or with writes to them guarded, see precision.bulk)."""
    return tree_map(lambda x: x.detach() if isinstance(x, torch.Tensor) and _compact(x) else _saveable(x), tree)


def restore(tree):
    """Arguments as the op takes them (``Unsaved`` markers stay: see ``check_replayable``)."""
    return tree_map(lambda x: x.value() if isinstance(x, TorchConstant) else x, tree)


def check_replayable(tree, what: str) -> None:
    for x in tree_leaves(tree):
        if isinstance(x, Unsaved):
            raise ValueError(f"{what}: argument {x.text} could not be saved, so this op cannot be replayed")


def tree_nbytes(tree) -> int:
    return sum(t.numel() * t.element_size() for t in tree_leaves(tree) if isinstance(t, torch.Tensor))


@dataclass
class Dump:
    """A capture directory opened for reading."""

    path: str
    meta: dict
    records: list[dict]

    @classmethod
    def open(cls, path: str) -> "Dump":
        index = os.path.join(path, INDEX)
        if not os.path.isdir(path):
            raise DumpError(f"{path}: not a directory; expected a capture directory with {INDEX}")
        if not os.path.isfile(index):
            raise DumpError(f"{path}: no {INDEX}; expected a directory written by precision.capture")
        meta_path = os.path.join(path, META)
        meta: dict = {}
        if os.path.isfile(meta_path):
            try:
                with open(meta_path) as f:
                    meta = json.load(f)
            except (OSError, json.JSONDecodeError) as exc:
                raise DumpError(f"{meta_path}: unreadable ({exc})") from exc
            if meta.get("format") != FORMAT:
                raise DumpError(f"{meta_path}: format {meta.get('format')!r}, expected {FORMAT!r}")
        records = []
        with open(index) as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise DumpError(f"{index}:{lineno}: not JSON ({exc.msg})") from exc
                if not isinstance(rec, dict) or "index" not in rec or "op" not in rec:
                    raise DumpError(f"{index}:{lineno}: expected an object with 'index' and 'op'")
                records.append(rec)
        return cls(path, meta, records)

    def by_index(self) -> dict[int, dict]:
        return {int(r["index"]): r for r in self.records}

    def record(self, index: int) -> dict:
        rec = self.by_index().get(int(index))
        if rec is None:
            raise DumpError(f"{self.path}: no op with index {index} (indices {self._range()})")
        return rec

    def _range(self) -> str:
        idx = sorted(int(r["index"]) for r in self.records)
        return f"{idx[0]}..{idx[-1]}, {len(idx)} records" if idx else "none"

    def load(self, rec: dict) -> dict | None:
        """{'args', 'kwargs', 'outputs'} of a record, or None when its tensors were not saved."""
        if not rec.get("file"):
            return None
        path = os.path.join(self.path, rec["file"])
        key = rec.get("key")
        try:
            if key is None:
                data = torch.load(path, weights_only=False, map_location="cpu")
            else:
                data = self._part(path)[key]
        except (OSError, RuntimeError, EOFError, KeyError) as exc:
            raise DumpError(f"{path}: cannot load tensors of op {rec['op']} #{rec['index']} ({exc!r})") from exc
        data["args"], data["kwargs"] = restore(data["args"]), restore(data["kwargs"])
        return data

    def _part(self, path: str) -> dict:
        # A part file holds many ops: mapped, not read, and kept while ops are read from it in order.
        cached = self.__dict__.get("_open_part")
        if cached is None or cached[0] != path:
            cached = self.__dict__["_open_part"] = (path, torch.load(path, weights_only=False, mmap=True))
        return cached[1]
