"""The capture format: DIR/meta.json, DIR/index.jsonl (one record per op), DIR/tensors/NNNNNN.pt
(inputs and outputs of one op, saved with torch.save). With ``bulk``: DIR/tensors/partNNNNN.bin
(ditorch_precision.part_file; before version 6 a torch zip file, partNNNNN.pt) holds many ops (a
step's, usually), each under its record's ``key``; a tensor several of them read is stored once.

A capture directory is data from elsewhere: it is read with ``torch.load(weights_only=True)`` (no
unpickling of arbitrary objects), so the files hold only tensors, containers and plain values;
arguments torch's safe loader does not know (slices, memory formats, ...) are written as tagged
dicts. Files named by the index must lie inside the directory."""
from __future__ import annotations

import json
import os
import pickle
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_leaves, tree_map

from .part_file import PartFile, PartFileError, view_of

FORMAT = "precision-capture"
# 1 and 2 held pickled Python objects, which are no longer loaded; 4: a per-op file may name a tensor
# an earlier file holds (REF) instead of holding it again; 6: a bulk capture's parts in their own layout
# (part_file), no longer torch zip files (still read); 7: both op hooks number the same ops
# (docs/precision.md, "Op numbering"): a capture of 6 or before numbered other ops (NUMBERED_ALIKE_SINCE).
VERSION = 7
NUMBERED_ALIKE_SINCE = 7
INDEX = "index.jsonl"
META = "meta.json"


class DumpError(ValueError):
    """A capture directory that cannot be read; the message names the file."""


def tensor_meta(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return {"shape": list(x.shape), "dtype": str(x.dtype).removeprefix("torch."), "device": str(x.device)}
    return None


def version_of(t: torch.Tensor) -> int | None:
    """``t``'s version counter, or None for a tensor made under ``torch.inference_mode()``, which keeps
    none: nothing about it can be reused on the promise that it is unchanged."""
    return None if t.is_inference() else t._version


def tensors_in(tree) -> list[torch.Tensor]:
    """The tensors ``tree_leaves`` finds, in its order: plain lists, tuples and dicts (an op's
    arguments and outputs) walked here, a few times cheaper per op than torch's pytree; any other
    container (a named tuple, a return type, a model's output class: pytree knows which of them it
    opens) handed to pytree."""
    found: list[torch.Tensor] = []
    _walk(tree, found)
    return found


def _walk(x, found: list) -> None:
    # A function of the module, not a closure: a closure that calls itself is a reference cycle,
    # which would keep ``found`` (the program's tensors) alive until the garbage collector runs
    # (autograd then copies a gradient it could have taken over, an op the program never ran).
    kind = type(x)
    if kind is list or kind is tuple:
        for v in x:
            _walk(v, found)
    elif kind is dict:
        for v in x.values():
            _walk(v, found)
    elif isinstance(x, torch.Tensor):
        found.append(x)
    elif isinstance(x, (list, tuple, dict)) or hasattr(x, "__dict__"):
        found.extend(t for t in tree_leaves(x) if isinstance(t, torch.Tensor))


def tensors_meta(tree) -> list:
    return [tensor_meta(t) for t in tensors_in(tree)]


# Tag of an argument stored as a dict {TAG: kind, ...}: ATen arguments are never dicts.
TAG = "__precision__"


# A tensor written by an earlier per-op file, stored as {TAG: REF, "file": rel, "tensor": k}: the k-th
# tensor (in ``tree_leaves`` order) of that file.
REF = "ref"


def tensor_ref(file: str, k: int, view: tuple[list[int], list[int], int] | None = None) -> dict:
    """``view``: (size, stride, storage offset) of a tensor on the storage of the k-th tensor of
    ``file``, which that file holds whole (it was saved uncopied)."""
    ref = {TAG: REF, "file": file, "tensor": k}
    if view is not None:
        ref["view"] = [list(view[0]), list(view[1]), int(view[2])]
    return ref


@dataclass(frozen=True)
class Unsaved:
    """An argument that could not be saved (e.g. a script object); replaying such an op fails clearly."""

    text: str


_PLAIN = (int, float, bool, str, complex, type(None), torch.dtype, torch.device)


def _encode(x):
    """A non-tensor argument as something ``torch.load(weights_only=True)`` reads back."""
    if isinstance(x, _PLAIN):
        return x
    if isinstance(x, (torch.memory_format, torch.layout)):
        return {TAG: "torch", "name": str(x).removeprefix("torch.")}
    if isinstance(x, slice):
        return {TAG: "slice", "args": [x.start, x.stop, x.step]}
    if x is Ellipsis:
        return {TAG: "ellipsis"}
    return {TAG: "unsaved", "text": repr(x)[:200]}


def _decode_tag(d: dict):
    kind = d.get(TAG)
    if kind == "torch" and isinstance(getattr(torch, str(d.get("name")), None), (torch.memory_format, torch.layout)):
        return getattr(torch, d["name"])
    if kind == "slice" and isinstance(d.get("args"), (list, tuple)) and len(d["args"]) == 3:
        return slice(*d["args"])
    if kind == "ellipsis":
        return Ellipsis
    return Unsaved(str(d.get("text", d))[:200])


def _plain(t: torch.Tensor) -> torch.Tensor:
    """A tensor subclass (an async collective's result, a wrapper) as the plain tensor it wraps, so
    a capture holds only what ``torch.load(weights_only=True)`` reads. A functional collective's
    result (``AsyncCollectiveTensor``) is waited for first: its elements are there only then."""
    while type(t) not in (torch.Tensor, torch.nn.Parameter) and hasattr(t, "__tensor_flatten__"):
        if _async_collective(t):
            torch.ops._c10d_functional.wait_tensor(t.elem)  # a no-op once waited (by the program or a hook)
        inner, _ = t.__tensor_flatten__()
        if len(inner) != 1:
            break
        t = getattr(t, inner[0])
    return t if type(t) in (torch.Tensor, torch.nn.Parameter) else t.as_subclass(torch.Tensor)


def _async_collective(t: torch.Tensor) -> bool:
    if not torch.distributed.is_available():
        return False
    from torch.distributed._functional_collectives import AsyncCollectiveTensor
    return isinstance(t, AsyncCollectiveTensor)


def readable(t: torch.Tensor) -> torch.Tensor:
    """``t``, or the plain tensor holding its elements where ``t`` is a wrapper without storage of
    its own (a functional collective's result, once waited for): what statistics are read from."""
    return t if type(t) in (torch.Tensor, torch.nn.Parameter) else _plain(t)


def _saveable(x):
    if isinstance(x, torch.Tensor):
        return _plain(x).detach().to("cpu", copy=True).contiguous()  # compact: a view would save its whole storage
    return _encode(x)


def snapshot(tree):
    """Compact CPU copies of every tensor; other arguments in a form torch.save can write."""
    return tree_map(_saveable, tree)


def _compact(t: torch.Tensor) -> bool:
    # Saving a tensor writes its whole storage: fine when the tensor covers exactly that storage.
    return (t.device.type == "cpu" and t.storage_offset() == 0 and t.layout == torch.strided
            and t.untyped_storage().nbytes() == t.numel() * t.element_size() and not t.is_conj() and not t.is_neg())


def saved_whole(t: torch.Tensor) -> bool:
    """Whether ``saveable_leaf`` writes this tensor uncopied, so its file holds its whole storage."""
    return _compact(t)


def saveable_leaf(x):
    """One argument as ``saveable_now`` writes it."""
    return _plain(x).detach() if isinstance(x, torch.Tensor) and _compact(x) else _saveable(x)


def saveable_now(tree):
    """Like ``snapshot``, but compact CPU tensors are not copied: only for a ``torch.save`` done
    before anything can change them (or with writes to them guarded, see ditorch_precision.bulk)."""
    return tree_map(saveable_leaf, tree)


def restore(tree):
    """Arguments as the op takes them (``Unsaved`` markers stay: see ``check_replayable``)."""
    if isinstance(tree, dict):
        return _decode_tag(tree) if TAG in tree else {k: restore(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(restore(v) for v in tree)
    return tree


def check_replayable(tree, what: str) -> None:
    for x in tree_leaves(tree):
        if isinstance(x, Unsaved):
            raise ValueError(f"{what}: argument {x.text} could not be saved, so this op cannot be replayed")


def tree_nbytes(tree) -> int:
    return sum(t.numel() * t.element_size() for t in tree_leaves(tree) if isinstance(t, torch.Tensor))


@dataclass
class Dump:
    """A capture directory opened for reading. Its index is checked whole on opening but not held:
    ``iter_records`` and ``step_chunks`` read it again line by line (a compare's memory does not
    grow with the number of ops); ``records`` loads it whole, once, for the callers that need it."""

    path: str
    meta: dict
    ops: frozenset = frozenset()  # op names of the op records
    dtypes: frozenset = frozenset()  # dtypes (names) of their outputs
    in_step_order: bool = True  # records grouped by step, steps increasing (see step_chunks)

    @classmethod
    def open(cls, path: str) -> "Dump":
        index = os.path.join(path, INDEX)
        if not os.path.isdir(path):
            raise DumpError(f"{path}: not a directory; expected a capture directory with {INDEX}")
        if not os.path.isfile(index):
            raise DumpError(f"{path}: no {INDEX}; expected a directory written by ditorch_precision.capture")
        meta_path = os.path.join(path, META)
        if not os.path.isfile(meta_path):  # written last: without it the run did not finish, or it is no capture
            raise DumpError(f"{path}: no {META}; expected a finished capture (its {META} is written when the "
                            "capture ends: a run that stopped early, or a copy without it, cannot be trusted)")
        meta: dict = {}
        try:
            with open(meta_path) as f:
                meta = json.load(f)
        except (OSError, json.JSONDecodeError) as exc:
            raise DumpError(f"{meta_path}: unreadable ({exc})") from exc
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            got = meta.get("format") if isinstance(meta, dict) else meta
            raise DumpError(f"{meta_path}: format {got!r}, expected {FORMAT!r}")
        dump = cls(path, meta)
        ops, dtypes, steps = set(), set(), []
        for rec in dump.iter_records():  # every line checked now, not midway through a compare
            if rec.get("kind", "op") == "op":
                ops.add(rec["op"])
                dtypes.update(o["dtype"] for o in rec.get("outputs") or () if isinstance(o, dict)
                              and isinstance(o.get("dtype"), str))
            step = rec.get("step")
            if not steps or steps[-1] != step:
                steps.append(step)
        dump.ops, dump.dtypes = frozenset(ops), frozenset(dtypes)
        dump.in_step_order = all(isinstance(s, int) for s in steps) and all(x < y for x, y in zip(steps, steps[1:]))
        return dump

    def iter_records(self):
        """The index records, read and checked line by line."""
        index = os.path.join(self.path, INDEX)
        try:
            f = open(index)
        except OSError as exc:
            raise DumpError(f"{index}: unreadable ({exc})") from exc
        with f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise DumpError(f"{index}:{lineno}: not JSON ({exc.msg})") from exc
                problem = _record_problem(rec)
                if problem:
                    raise DumpError(f"{index}:{lineno}: {problem}")
                yield rec

    def step_chunks(self):
        """(step, records) for each run of consecutive records of one step, in index order."""
        chunk: list[dict] = []
        step = None
        for rec in self.iter_records():
            if chunk and rec.get("step") != step:
                yield step, chunk
                chunk = []
            step = rec.get("step")
            chunk.append(rec)
        if chunk:
            yield step, chunk

    @property
    def records(self) -> list[dict]:
        """Every index record, loaded once and held."""
        held = self.__dict__.get("_records")
        if held is None:
            held = self.__dict__["_records"] = list(self.iter_records())
        return held

    @property
    def op_records(self) -> list[dict]:
        """The op records (not the module records: kind "module")."""
        return [r for r in self.records if r.get("kind", "op") == "op"]

    def by_index(self) -> dict[int, dict]:
        return {int(r["index"]): r for r in self.op_records}

    def record(self, index: int) -> dict:
        rec = self.by_index().get(int(index))
        if rec is None:
            raise DumpError(f"{self.path}: no op with index {index} (indices {self._range()})")
        return rec

    def _range(self) -> str:
        idx = sorted(int(r["index"]) for r in self.op_records)
        return f"{idx[0]}..{idx[-1]}, {len(idx)} records" if idx else "none"

    def file_path(self, rec: dict) -> str:
        """The record's tensor file, which must lie inside the capture directory."""
        # checked once per file name: realpath walks every component with a system call
        checked = self.__dict__.setdefault("_checked_files", {})
        path = checked.get(rec["file"])
        if path is not None:
            return path
        root = self.__dict__.get("_root") or self.__dict__.setdefault("_root", os.path.realpath(self.path))
        path = os.path.realpath(os.path.join(root, rec["file"]))
        if os.path.commonpath([root, path]) != root:
            raise DumpError(f"{self.path}: op {rec['op']} #{rec['index']} names file {rec['file']!r} outside the "
                            "capture directory; refusing to read it")
        checked[rec["file"]] = path
        return path

    def load(self, rec: dict) -> dict | None:
        """{'args', 'kwargs', 'outputs'} of a record, or None when its tensors were not saved."""
        if not rec.get("file"):
            named = rec.get("named")
            if named is not None:  # an op whose tensors are all named by reference
                data = self._resolve_refs(named, rec)
                data["args"], data["kwargs"] = restore(data["args"]), restore(data["kwargs"])
                return data
            if rec.get("refs") is None:
                return None
            return self._resolve_refs({"args": [], "kwargs": {}, "outputs": rec["refs"]}, rec)  # all named
        path = self.file_path(rec)
        key = rec.get("key")
        try:
            data = _safe_load(path) if key is None else self._part(path)[key]
        except (OSError, RuntimeError, EOFError, KeyError, pickle.UnpicklingError, PartFileError) as exc:
            raise DumpError(f"{path}: cannot load tensors of op {rec['op']} #{rec['index']} ({_first_line(exc)}); "
                            "captures are read with torch.load(weights_only=True) and must hold only tensors and "
                            "plain values (captures of precision before format version 3 must be taken again)") from exc
        if not (isinstance(data, dict) and {"args", "kwargs", "outputs"} <= data.keys()):
            raise DumpError(f"{path}: op {rec['op']} #{rec['index']}: expected a dict with args, kwargs and outputs")
        data = self._resolve_refs(data, rec)
        data["args"], data["kwargs"] = restore(data["args"]), restore(data["kwargs"])
        return data

    def _resolve_refs(self, tree, rec: dict):
        """Tensors named by reference (``REF``) replaced by the tensors their files hold."""
        if isinstance(tree, dict):
            if tree.get(TAG) == REF:
                return self._referenced(tree, rec)
            return {k: self._resolve_refs(v, rec) for k, v in tree.items()}
        if isinstance(tree, (list, tuple)):
            return type(tree)(self._resolve_refs(v, rec) for v in tree)
        return tree

    def _referenced(self, ref: dict, rec: dict) -> torch.Tensor:
        file, k = ref.get("file"), ref.get("tensor")
        if not isinstance(file, str) or not isinstance(k, int) or isinstance(k, bool):
            raise DumpError(f"{self.path}: op {rec['op']} #{rec['index']}: bad tensor reference {ref!r}; expected "
                            "a file name and a tensor number")
        path = self.file_path({**rec, "file": file})
        cache = self.__dict__.setdefault("_ref_files", {})
        tensors = cache.get(path)
        if tensors is None:
            try:
                data = _safe_load(path, mmap=True)
            except (OSError, RuntimeError, EOFError, pickle.UnpicklingError) as exc:
                raise DumpError(f"{path}: cannot load the tensors op {rec['op']} #{rec['index']} refers to "
                                f"({_first_line(exc)})") from exc
            tensors = [t for t in tree_leaves(data) if isinstance(t, torch.Tensor)]
            if len(cache) >= 16:  # mapped files, kept for the ops read next
                cache.pop(next(iter(cache)))
            cache[path] = tensors
        if not 0 <= k < len(tensors):
            raise DumpError(f"{path}: op {rec['op']} #{rec['index']} refers to tensor {k}; the file holds "
                            f"{len(tensors)}")
        view = ref.get("view")
        return tensors[k] if view is None else _view_of(tensors[k], view, f"{path}: op {rec['op']} #{rec['index']}")

    def _part(self, path: str) -> dict:
        # A part file holds many ops: mapped, not read, and kept while ops are read from it in order.
        # (format version 6: the part file's own layout, see part_file; a torch zip file before)
        cached = self.__dict__.get("_open_part")
        if cached is None or cached[0] != path:
            with open(path, "rb") as f:
                zipped = f.read(2) == b"PK"
            try:
                part = _safe_load(path, mmap=True) if zipped else PartFile(path)
            except PartFileError as exc:
                raise DumpError(str(exc)) from exc
            cached = self.__dict__["_open_part"] = (path, part)
        return cached[1]


def unwritten_masks(data: dict | None, where: str, what: str) -> dict[int, torch.Tensor]:
    """{k: mask} of the k-th tensor of a record's ``where`` ("inputs": args and kwargs, or
    "outputs"): its elements no op wrote since an ``empty*`` allocated them (Capture's ``unwritten``)."""
    if not data or not data.get("unwritten"):
        return {}
    entries = data["unwritten"].get(where, []) if isinstance(data["unwritten"], dict) else None
    tensors = [t for t in tree_leaves((data["args"], data["kwargs"]) if where == "inputs" else data["outputs"])
               if isinstance(t, torch.Tensor)]
    out = {}
    for item in entries if isinstance(entries, list) else [None]:
        ok = (isinstance(item, (list, tuple)) and len(item) == 2 and isinstance(item[0], int)
              and 0 <= item[0] < len(tensors) and isinstance(item[1], torch.Tensor) and item[1].dtype == torch.bool
              and item[1].shape == tensors[item[0]].shape)
        if not ok:
            raise DumpError(f"{what}: bad 'unwritten' entry {item!r:.80}; expected [tensor number, bool mask of "
                            "that tensor's shape]")
        out[item[0]] = item[1]
    return out


def checked_lines(path: str, problem_of):
    """The JSON objects of a capture's side file (``transfers.jsonl``, ``optimizer_steps.jsonl``), one a
    line, each checked by ``problem_of`` (what is wrong, or None): data from another run, a bad line
    raises ``DumpError`` naming it."""
    with open(path) as f:
        for n, line in enumerate(f, 1):
            try:
                rec = json.loads(line)
            except ValueError as exc:
                raise DumpError(f"{path}:{n}: not JSON ({exc})") from exc
            problem = problem_of(rec)
            if problem:
                raise DumpError(f"{path}:{n}: {problem}")
            yield rec


def _safe_load(path: str, mmap: bool = False):
    return torch.load(path, weights_only=True, map_location="cpu", mmap=mmap)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    unsupported = next((line.strip() for line in text.splitlines() if "Unsupported" in line), None)
    return f"{type(exc).__name__}: {unsupported or text.splitlines()[0] if text else ''}"


def _record_problem(rec) -> str | None:
    """What is wrong with one index.jsonl record, or None."""
    if not isinstance(rec, dict):
        return "expected a JSON object"
    for key, types in (("index", int), ("op", str)):
        if key not in rec:
            return f"missing field {key!r} (every record needs 'index' and 'op')"
        if not isinstance(rec[key], types) or isinstance(rec[key], bool):
            return f"field {key!r} is {rec[key]!r}, expected {'an integer' if types is int else 'a string'}"
    for key in ("file", "key", "overload", "module", "phase", "kind"):
        if rec.get(key) is not None and not isinstance(rec[key], str):
            return f"field {key!r} is {rec[key]!r}, expected a string or null"
    refs = rec.get("refs")
    if refs is not None and not (isinstance(refs, list) and all(isinstance(r, dict) and r.get(TAG) == REF
                                                                for r in refs)):
        return f"field 'refs' is {refs!r:.80}, expected a list of tensor references"
    group = rec.get("group")
    if group is not None and not (isinstance(group, list) and all(isinstance(r, int) and not isinstance(r, bool)
                                                                  for r in group)):
        return f"field 'group' is {group!r:.80}, expected a list of ranks or null"
    named = rec.get("named")
    if named is not None and not (isinstance(named, dict) and isinstance(named.get("args"), list)
                                  and isinstance(named.get("kwargs"), dict) and "outputs" in named):
        return f"field 'named' is {named!r:.80}, expected an object with args (a list), kwargs and outputs"
    if rec.get("signature") is not None and not isinstance(rec["signature"], dict):
        return f"field 'signature' is {rec['signature']!r:.80}, expected an object of argument values"
    if rec.get("random") not in (None, True, False):
        return f"field 'random' is {rec['random']!r:.80}, expected true, false or null"
    step = rec.get("step")
    if step is not None and (not isinstance(step, int) or isinstance(step, bool)):
        return f"field 'step' is {rec['step']!r}, expected an integer"
    return None


def _view_of(base: torch.Tensor, view, where: str) -> torch.Tensor:
    """The tensor (size, stride, offset) on the storage of ``base`` (a tensor saved whole)."""
    try:
        return view_of(base, view, where)
    except PartFileError as exc:
        raise DumpError(str(exc)) from exc


class DumpWriter:
    """Writes a capture directory op by op (what ``Dump`` reads): used for the inputs of failing ops."""

    def __init__(self, path: str) -> None:
        self.path = path
        os.makedirs(os.path.join(path, "tensors"), exist_ok=True)
        self._index = open(os.path.join(path, INDEX), "w")
        self.n_records = 0

    def write(self, entry: dict, args, kwargs, outputs) -> None:
        rel = os.path.join("tensors", f"{int(entry['index']):07d}.pt")
        torch.save({"args": snapshot(args), "kwargs": snapshot(kwargs), "outputs": snapshot(outputs)},
                   os.path.join(self.path, rel))
        self._index.write(json.dumps({**entry, "file": rel}) + "\n")
        self._index.flush()
        self.n_records += 1

    def close(self, **meta) -> None:
        self._index.close()
        with open(os.path.join(self.path, META), "w") as f:
            json.dump({"format": FORMAT, "version": VERSION, "n_records": self.n_records, **meta}, f, indent=1)
