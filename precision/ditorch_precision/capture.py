"""capture: write the inputs and outputs (forward and backward, so gradients too) of the selected
ops to a directory, up to a size cap."""
from __future__ import annotations

import json
import logging
import os
import time
import weakref
from functools import partial

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._pytree import tree_flatten, tree_leaves, tree_map, tree_unflatten

from .dump import (FORMAT, INDEX, META, VERSION, saveable_leaf, saved_whole, snapshot, tensor_ref, tensors_in,
                   tensors_meta, tree_nbytes, version_of)
from . import optimizer_replay
from .align import INPUTS_OP, PARAMS_OP
from .bulk import PendingWrites, storage_address, tensor_key
from .model_state import INPUT_OP, META_KEY as STATE_META, STATE_OP, data_inputs, optimizer_had_state, state_of
from .collectives import POINT_TO_POINT, group_ranks, is_collective, reduce_op_name, wait_collective
from .native_hook import HOOKS, NativeHook, choose, hand_groups
from .opinfo import op_info
from .part_file import writable, write_part
from .point_to_point import TransferLog, write_transfers
from .records import OpRecord
from .reference import without_randomness
from .selection import Selector
from .signature import signature
from .summaries import MODES, StatsReuse, summarise
from .unwritten import ALLOCATORS, Unwritten
from .tool import Tool
from .writer import BackgroundWriter

log = logging.getLogger("precision")


def _save(obj, path: str) -> None:
    # Without the zip records' CRC32 (torch.load does not need it), which is a third of the time.
    crc = torch.serialization.get_crc32_options()
    torch.serialization.set_crc32_options(False)
    try:
        torch.save(obj, path)
    finally:
        torch.serialization.set_crc32_options(crc)


def _save_part(payloads: dict, path: str) -> None:
    """A bulk capture's part: its own layout (part_file) when every tensor fits it, else torch's."""
    if writable(payloads):
        write_part(payloads, path)
    else:
        _save(payloads, path)


def _json_plain(tree) -> bool:
    """Whether a payload can go into the index as it is (JSON): no dtype, device or complex value."""
    if isinstance(tree, dict):
        return all(isinstance(k, str) and _json_plain(v) for k, v in tree.items())
    if isinstance(tree, (list, tuple)):
        return all(_json_plain(v) for v in tree)
    return tree is None or (isinstance(tree, (int, float, str)) and not isinstance(tree, complex))


def _zeroed(tree, masks: list):
    """``tree`` with the masked elements of its k-th tensors set to 0 (copies)."""
    if not masks:
        return tree
    leaves, spec = tree_flatten(tree)
    where = dict(masks)
    k = 0
    for i, x in enumerate(leaves):
        if isinstance(x, torch.Tensor):
            if k in where:
                leaves[i] = x.detach().masked_fill(where[k].to(x.device), 0)
            k += 1
    return tree_unflatten(leaves, spec)


def _storage_or_none(t: torch.Tensor) -> int | None:
    try:
        return storage_address(t)
    except RuntimeError:  # a wrapper subclass (an async collective's result) has no storage of its own
        return None


def _before_writing(written: list[torch.Tensor], tree, copies: dict):
    """``tree`` (an op's arguments) with a copy of each tensor on a storage the op writes: its state
    before the op (the copy ``PendingWrites.guard`` just made of it, ``copies``, where there is one;
    else a compact one). The others stay as they are (the op leaves them unchanged), so a tensor
    passed twice, as AdamW passes the gradient to ``addcmul_``, is held once."""
    storages = {_storage_or_none(t) for t in written}

    def before(x):
        if not isinstance(x, torch.Tensor) or _storage_or_none(x) not in storages:
            return x
        copy = copies.get(tensor_key(x)) if copies and x.layout == torch.strided else None
        return snapshot(x) if copy is None else copy

    return tree_map(before, tree)


class Capture(Tool):
    """``with Capture("dump/{rank}", Selector.build(modules="layers.1")): train()``.

    ``max_bytes`` caps the tensor bytes written; past it, ops are still indexed (``file: null``).
    ``mode``: "full" (tensors), "stats" (per output: min, max, mean, norm, NaN/Inf counts in the
    index, no tensor files) or "checksum" (per output: a hash of its bytes).
    ``bulk=True`` (the default: one file per op costs a file creation per op, the floor of a
    per-op capture): the ops' tensors are held and written together, one file per step (or per
    ``bulk_bytes`` held), so a tensor several ops read is written once (see part_file, read
    through ``Dump``); it holds up to a step's captured tensors in memory meanwhile, and
    ``background=True`` (the default) saves the part files on a thread of their own. With
    ``bulk=False``, one file per op: a tensor an earlier op's file holds, unchanged since (same
    tensor, same version counter), is written as a reference to that file, not again.

    ``hook``: what shows the capture each op. "python": a dispatch mode (every mode and selection);
    "cpp": the C++ observer (``native_hook``; no selection, no call sites: mode "stats", each op's
    statistics in one fused C++ pass, or mode "full" with ``bulk`` outside torch.distributed, each
    op's tensors kept in C++ and its part files written by a C++ thread; no Python per op); "auto"
    (the default): "cpp" where it can run (a stats capture under torch.distributed excepted), else
    "python". Both number the same ops (docs/precision.md, "Op numbering"). ``hook_used`` and
    meta.json's ``hook`` say which one ran, and the log says why not "cpp"."""

    name = "capture"

    def __init__(self, path: str, selector: Selector | None = None, *, max_bytes: int | None = 1 << 30,
                 save_tensors: bool = True, bulk: bool = True, bulk_bytes: int = 256 << 20,
                 module_outputs: bool = True, mode: str = "full", background: bool = True, hook: str = "auto",
                 **kwargs) -> None:
        if mode not in MODES:
            raise ValueError(f"capture mode {mode!r}; expected one of {', '.join(MODES)}")
        self.wants_module_outputs = module_outputs
        super().__init__(selector, **kwargs)
        self.mode = mode
        save_tensors = save_tensors and mode == "full"
        self._n_module_records = 0
        self.bulk, self.bulk_bytes = bulk, bulk_bytes
        self._pending = PendingWrites() if bulk else None
        self._guard_copies: dict = {}  # what the guard copied for the op being run (_before_writing)
        self.background = background and bulk and mode == "full"
        self._writer: BackgroundWriter | None = None
        self._n_parts = 0
        self.path_template = path
        self.path = path
        self.max_bytes = max_bytes
        self.save_tensors = save_tensors
        self.bytes_written = 0
        self.n_records = 0
        self.n_dropped = 0
        self.index_waits = 0  # C++ hook: steps whose index lines waited for the index thread's queue
        self.write_waits = 0  # C++ hook, full: ops that waited for a part file holding what they write
        self._index = None
        # id(tensor) -> (weak reference, version, file, tensor number) of the tensors per-op files hold
        self._written: dict[int, tuple[weakref.ref, int, str, int, int]] = {}  # ... storage address
        self._written_storages: dict[int, set[int]] = {}  # storage address -> ids in _written
        # storage address -> (weak reference to the storage, file, tensor number, dtype, the saved tensor,
        # its version) of a tensor saved with its whole storage: any view on it is named as a view of it
        self._storage_files: dict[int, tuple[StorageWeakRef, str, int, torch.dtype, weakref.ref, int]] = {}
        self._storage_files_limit = 1024
        self.transfers = TransferLog()
        self._unwritten = Unwritten()  # what empty* allocated and no op has written since
        self._stats = StatsReuse() if mode == "stats" else None
        if hook not in HOOKS:  # here, not on entry
            raise ValueError(f"capture hook {hook!r}; expected one of {', '.join(HOOKS)}")
        self.hook = hook
        self.hook_used: str | None = None
        self._native: NativeHook | None = None
        # the parameters and buffers of each root module before its first op (model_state)
        self.modules.on_root = self._on_root
        self.modules.on_root_return = self._on_root_return
        self._state_roots: list[dict] = []
        self._input_names: dict[str, list[str]] = {}  # root path -> names of its data inputs (first call)
        self._trained_before: bool | None = None  # the optimizer held state at its first step in the capture
        self._first_step = self.steps.step

    def start(self) -> None:
        self.hook_used, why = choose(self, self.hook)
        if self.hook_used == "python" and self.hook == "auto" and self.mode in ("stats", "full"):
            log.info("capture: Python op hook (%s)", why)
        self.path = self.path_template.format(rank=self.rank.get())
        os.makedirs(os.path.join(self.path, "tensors"), exist_ok=True)
        self._index = open(os.path.join(self.path, INDEX), "w")
        self._steps_log = optimizer_replay.StepLog(self.path)
        self._t0 = time.time()
        self._pid = os.getpid()  # the process that finishes it (finish)
        if self.background and self.hook_used != "cpp":  # the C++ hook writes its parts on its own thread
            self._writer = BackgroundWriter(_save_part)

    # the C++ op hook -----------------------------------------------------------------------------
    def _op_hook(self):
        if self.hook_used != "cpp":
            return super()._op_hook()
        self._native = NativeHook(self)
        return self._native

    def drain_native(self) -> None:
        """Hand the records the C++ observer holds to its index thread, which writes their lines
        (in call order) to the index file; Python writes nothing there meanwhile."""
        if self._native is None:
            return
        obs = self._native.observer
        self.n_records += obs.drain()
        self.n_ops = obs.count()
        if self.mode == "full":
            self.bytes_written, self.n_dropped = obs.bytes_written(), obs.dropped()
            self._n_parts = obs.parts()

    def handle(self, rec: OpRecord, func, args, kwargs):
        # An op that writes an argument changes its inputs: those are copied before it runs. The
        # others' inputs are as they were, and are saved after it, uncopied where compact.
        inputs = in_masks = None
        info = op_info(func)
        mutates = info.mutates
        if mutates and self._unwritten:  # what its inputs held before it wrote them
            with self.quiet():
                in_masks = [self._unwritten.mask(t) for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if self.save_tensors and mutates:
            with self.quiet():
                inputs = _before_writing(info.written_tensors(args, kwargs), (args, kwargs), self._guard_copies)
        if rec.op in POINT_TO_POINT:  # hashed for the cross-rank check of a compare (transfers.jsonl)
            out = self.transfers.run(rec.to_dict(), func, args, kwargs, group_ranks(rec.op, args), self.quiet)
        else:
            out = func(*args, **kwargs)
        with self.quiet():
            self._track_writes(info, args, kwargs, out)
            saved = out
            if is_collective(rec.op):  # its outputs hold the result only once it completed
                wait_collective(out, rec.op)
                if rec.op in POINT_TO_POINT[1:]:
                    saved = ([], out)  # a receive is not waited for (see collectives): its data is not known yet
                elif rec.op.startswith("c10d::") and not isinstance(out, tuple):
                    saved = (args[0], out)  # it returns only a Work: what it wrote comes first, as for allreduce_
            # What it wrote gets its new version only once this returns: not named by reference.
            # A random op says whether it drew (not with dropout_p 0): a compare that cannot tell (its
            # torch does not know the op, or no tensors were saved) reads it.
            drew = not without_randomness(func, args, kwargs) if info.random else None
            self._write(rec, args, kwargs, inputs, saved, refs=not mutates, random=drew, in_masks=in_masks)
        return out

    def _track_writes(self, info, args, kwargs, out) -> None:
        if info.mutates and self._unwritten:
            self._unwritten.written(info.written_tensors(args, kwargs))
        if info.op in ALLOCATORS:
            self._unwritten.allocated(out)

    def _masks(self, tree, masks: list | None = None) -> list:
        """[(k, mask)] for the k-th tensor of ``tree`` holding elements no op has written since an
        ``empty*`` (``masks``: taken before the op)."""
        tensors = tensors_in(tree)
        found = masks if masks is not None else [self._unwritten.mask(t) for t in tensors]
        return [(k, m) for k, m in enumerate(found) if m is not None]

    # module records -------------------------------------------------------------------------
    def on_module_output(self, path: str, output) -> None:
        """Selected modules (when no op filter is set): their outputs, and the gradients of those
        outputs when backward reaches them, as records of kind "module" (ops "module::output",
        "module::grad"), so regions whose op sequences differ between runs can still be compared."""
        sel, step, rank = self.selector, self.steps.step, self.rank.get()
        if (sel.ops is not None or not sel.module_ok(path) or (sel.steps is not None and step not in sel.steps)
                or (sel.ranks is not None and rank not in sel.ranks)):
            return
        tensors = tensors_in(output)
        if not tensors:
            return
        if sel.phases is None or "forward" in sel.phases:
            self._module_record("module::output", "forward", path, step, rank, tensors)
        if sel.phases is None or "backward" in sel.phases:
            for t in tensors:
                if t.requires_grad:
                    t.register_hook(lambda g, path=path, step=step: self._module_grad(path, step, g))

    def _on_root(self, module: torch.nn.Module, path: str) -> None:
        """A root module's parameters and buffers the first time it runs, before its first op, as a
        module record (``STATE_OP``; their names in meta.json): a compare checks that both runs start
        from the same ones (model_state)."""
        if not self._records_whole_model("forward"):
            return
        names, tensors = state_of(module)
        if tensors:
            self._state_roots.append({"module": path, "step": self.steps.step, "names": names})
            self._module_record(STATE_OP, "forward", path, self.steps.step, self.rank.get(), self._held(tensors))

    def _on_root_return(self, path: str, args, kwargs) -> None:
        """The data a root module was called with (its integer and boolean tensors: token ids, labels,
        masks), as a module record (``INPUT_OP``) at each return: a compare checks that both runs were
        fed the same (model_state)."""
        if not self._records_whole_model("forward"):
            return
        names, tensors = data_inputs(args, kwargs)
        if tensors:
            self._input_names.setdefault(path, names)
            self._module_record(INPUT_OP, "forward", path, self.steps.step, self.rank.get(), self._held(tensors))

    def _records_whole_model(self, phase: str) -> bool:
        """Whether records of the whole model in ``phase`` are selected now: its state and data
        (forward), the optimizer's (optimizer). Not under a selection of ops or modules, nor outside
        the selected steps, ranks and phases."""
        sel, step, rank = self.selector, self.steps.step, self.rank.get()
        return not (sel.ops is not None or sel.modules is not None
                    or (sel.phases is not None and phase not in sel.phases)
                    or (sel.steps is not None and step not in sel.steps)
                    or (sel.ranks is not None and rank not in sel.ranks))

    def _held(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """The tensors as a module record takes them: the C++ observer of a stats capture takes them
        themselves (the statistics their last in-place write left are reused; a detach is another
        tensor, whose elements it would read again), otherwise detached."""
        if self._native is not None and self.mode == "stats":
            return tensors
        with self.quiet():  # the hook runs under the mode: these detaches are no op of the program
            return [t.detach() for t in tensors]

    def on_optimizer_start(self, optimizer) -> None:
        """The step's description in ``optimizer_steps.jsonl`` (every mode: a compare compares the
        runs' options), and in a full capture what it starts from (parameters, gradients, the
        optimizer's state) as a module record ("optimizer::inputs"), so a compare can replay the step
        (optimizer_replay)."""
        if self.steps.step == self._first_step:  # the capture's first step: did the run train before it?
            self._trained_before = bool(self._trained_before) or optimizer_had_state(optimizer)
        if not self._records_whole_model("optimizer"):
            return
        desc, tensors = optimizer_replay.describe(optimizer)
        # the call number of the step's first op: a compare ranks a changed option there, before the ops it changes
        desc["index"] = self._native.observer.count() if self._native is not None else self.n_ops
        self._steps_log.write(self.steps.step, self.rank.get(), desc)
        if self.save_tensors and optimizer_replay.why_not(desc) is None:  # else no replay will read them
            self._module_record(INPUTS_OP, "optimizer", None, self.steps.step, self.rank.get(), self._held(tensors))

    def on_optimizer_step(self, optimizer) -> None:
        """The parameters after the step, as a module record ("optimizer::params", phase optimizer),
        under the same selection as module outputs: they judge an optimizer region, whose op
        sequences differ between the runs (fused against foreach kernels) or whose kernels return
        nothing (``_fused_adamw_``)."""
        if not self._records_whole_model("optimizer"):
            return
        params = [p for group in optimizer.param_groups for p in group["params"]]
        if params:
            self._module_record(PARAMS_OP, "optimizer", None, self.steps.step, self.rank.get(), self._held(params))

    def _module_grad(self, path: str, step: int, grad: torch.Tensor) -> None:
        if self._index is not None:  # the tool may have been left before backward ran
            self._module_record("module::grad", "backward", path, step, self.rank.get(), [grad])

    def _module_record(self, op: str, phase: str, path: str, step: int, rank: int, tensors: list) -> None:
        if self._native is not None:  # written in C++, in call order with the ops
            self._native.observer.module_record(op, phase, path or "", step, tensors)
            return
        rec = OpRecord(self.n_ops, op, "default", phase, path, step, rank)
        name = f"m{self._n_module_records:07d}"
        self._n_module_records += 1
        with self.quiet():
            self._write(rec, (), {}, ((), {}), tensors, name=name, kind="module")

    def _write(self, rec: OpRecord, args, kwargs, inputs, out, name: str | None = None, kind: str = "op",
               refs: bool = True, random: bool | None = None, in_masks: list | None = None) -> None:
        name = name or f"{rec.index:07d}"
        # The allocator's leftovers differ between runs and may be NaN: their positions are saved
        # with the tensors (``unwritten``), and no rule of a compare judges them.
        unwritten: dict = {}
        if self._unwritten or in_masks:
            unwritten = {"inputs": self._masks((args, kwargs), in_masks), "outputs": self._masks(out)}
            unwritten = {k: v for k, v in unwritten.items() if v}
        if unwritten:
            refs = False  # a file of its own that holds the masks
        entry = rec.to_dict()
        if kind != "op":
            entry["kind"] = kind
        if random is not None:
            entry["random"] = random
        if unwritten:  # how many elements no op wrote since an empty*
            entry["unwritten"] = sum(int(m.sum()) for masks in unwritten.values() for _, m in masks)
        entry["inputs"] = tensors_meta((args, kwargs))
        entry["outputs"] = tensors_meta(out)
        entry["file"] = None
        if is_collective(rec.op):
            entry["reduce_op"] = reduce_op_name(args)
            entry["group"] = group_ranks(rec.op, args)  # its roots and pieces are ranks of this group
        if self._stats is not None and not unwritten:
            entry.update(self._stats.stats(rec.op, args, out, writes=not refs))  # refs: it writes nothing
        elif self.mode != "full":  # leftovers count as 0 in both runs' summaries
            entry.update(summarise(self.mode, _zeroed(out, unwritten.get("outputs", []))))
        if not self.save_tensors and kind == "op":  # no file holds the arguments: a compare reads them here
            entry["signature"] = signature(rec.op, rec.overload, args, kwargs)
        if self.save_tensors:
            fresh: list = []  # the tensors this file holds, in order (None: a copy made before the op)
            # as they are now, but for what the op wrote: copied before it (handle)
            inputs = self._saveable((args, kwargs) if inputs is None else inputs, fresh, refs)
            outputs = self._saveable(out, fresh, refs)  # written now, or held under guard (bulk)
            payload = {"args": inputs[0], "kwargs": inputs[1], "outputs": outputs}
            if unwritten:
                payload["unwritten"] = {k: [[i, m] for i, m in v] for k, v in unwritten.items()}
            size = tree_nbytes(inputs) + tree_nbytes(outputs)
            if kind != "op" and self._pending is None and not fresh and payload["outputs"]:
                # A module record whose tensors all are named by reference: in the index, no file (a
                # file's creation costs more than the op's other work).
                entry["refs"] = payload["outputs"]
            elif kind == "op" and self._pending is None and not fresh and _json_plain(payload):
                entry["named"] = payload  # the same for an op (a view of a tensor a file holds)
            elif self.max_bytes is None or self.bytes_written + size <= self.max_bytes:
                if self._pending is not None:
                    rel, entry["key"] = self._part_name(), name
                    self._pending.add(entry["key"], payload, size)
                else:
                    rel = os.path.join("tensors", f"{name}.pt")
                    _save(payload, os.path.join(self.path, rel))
                    self._remember(fresh, rel)
                self.bytes_written += size
                entry["file"] = rel
            else:
                if self.n_dropped == 0:
                    log.warning("capture: size cap of %d bytes reached at op %s #%d; later ops are indexed "
                                "without tensors", self.max_bytes, rec.op, rec.index)
                self.n_dropped += 1
        # Buffered, flushed each step: a capture without meta.json (written last) is refused anyway.
        self._index.write(json.dumps(entry) + "\n")
        self.n_records += 1
        if self._pending is not None and self._pending.nbytes >= self.bulk_bytes:
            self.flush()

    # tensors written once ----------------------------------------------------------------------
    def _saveable(self, tree, fresh: list, refs: bool = True):
        """``saveable_now``, except (per-op files, ``refs``) a tensor an earlier file holds, unchanged
        since, is a reference to it. Each tensor kept is appended to ``fresh`` (None: not to be named
        by later files)."""
        refs = refs and self._pending is None

        def one(x):
            if not isinstance(x, torch.Tensor):
                return saveable_leaf(x)
            if refs and x.layout == torch.strided:
                named = self._named(x)
                if named is not None:
                    return named
            # an inference tensor keeps no version counter: never named by reference, always written
            fresh.append((x, x._version) if refs and x.layout == torch.strided and not x.is_inference() else None)
            return saveable_leaf(x)

        return tree_map(one, tree)

    def _named(self, x: torch.Tensor) -> dict | None:
        """A reference for a tensor an earlier file holds, unchanged since; or for a view on the
        storage of one that file holds whole (a view op's output, a slice of an output): size,
        stride and offset on it. None otherwise."""
        hit = self._written.get(id(x))
        if hit is not None and hit[0]() is x and hit[1] == version_of(x):
            return tensor_ref(hit[2], hit[3])
        whole = self._storage_files.get(_storage_or_none(x))
        # the storage is still the one saved (alive since), and nothing has written it since: no op
        # the tool saw, nor one it did not (a quiet block): views share their base's version counter
        if (whole is not None and not whole[0].expired() and whole[3] == x.dtype
                and (saved := whole[4]()) is not None and version_of(saved) == whole[5]):
            return tensor_ref(whole[1], whole[2], (list(x.shape), list(x.stride()), x.storage_offset()))
        return None

    def _remember(self, fresh: list, rel: str) -> None:
        for k, item in enumerate(fresh):
            if item is not None:
                x, version = item
                storage = _storage_or_none(x)
                if storage is None:
                    continue
                self._written[id(x)] = (weakref.ref(x, partial(self._forget, id(x))), version, rel, k, storage)
                self._written_storages.setdefault(storage, set()).add(id(x))
                held = self._storage_files.get(storage)
                if saved_whole(x) and (held is None or held[0].expired()):  # an address freed and reused
                    self._storage_files[storage] = (StorageWeakRef(x.untyped_storage()), rel, k, x.dtype,
                                                    weakref.ref(x), version)
        if len(self._storage_files) > self._storage_files_limit:  # storages freed since: forget them
            self._storage_files = {key: v for key, v in self._storage_files.items() if not v[0].expired()}
            self._storage_files_limit = max(1024, 2 * len(self._storage_files))

    def _forget(self, key: int, ref: weakref.ref) -> None:
        hit = self._written.get(key)
        if hit is not None and hit[0] is ref:
            del self._written[key]
            ids = self._written_storages.get(hit[4])
            if ids is not None:
                ids.discard(key)
                if not ids:
                    del self._written_storages[hit[4]]

    # bulk mode ---------------------------------------------------------------------------------
    def _part_name(self) -> str:
        return os.path.join("tensors", f"part{self._n_parts:05d}.bin")

    def _dispatch(self, func, args, kwargs):
        if self.transfers.waiting:
            self.transfers.before_op(op_info(func), args, kwargs, self.quiet)
        if self._pending or self._written or self._storage_files or self._writer:  # every op that writes a
            info = op_info(func)                                                    # held or named tensor
            if info.mutates:
                with self.quiet():
                    written = info.written_tensors(args, kwargs)
                    if self._writer:  # a part being written holds it
                        self._writer.wait_for(written)
                    if self._pending:
                        self._guard_copies = self._pending.guard(written)
                    for t in written:  # also through an alias with its own version counter (``.data``)
                        storage = _storage_or_none(t)
                        self._storage_files.pop(storage, None)
                        for key in self._written_storages.pop(storage, ()):
                            self._written.pop(key, None)
        try:
            out = super()._dispatch(func, args, kwargs)
        finally:
            self._guard_copies = {}
        info = op_info(func)
        if info.op in ALLOCATORS or (info.mutates and self._unwritten):  # also for ops not selected
            with self.quiet():
                self._track_writes(info, args, kwargs, out)
        return out

    def flush(self) -> None:
        """Bulk mode: write the held tensors now."""
        if self._pending:
            path = os.path.join(self.path, self._part_name())
            with self.quiet():  # also called from an optimizer hook, where the mode is active
                if self._writer is not None:
                    storages = self._pending.storages()
                    self._writer.submit(path, self._pending.take(), storages)
                else:
                    _save_part(self._pending.take(), path)
            self._n_parts += 1

    def on_step(self) -> None:
        self.drain_native()
        if self._native is not None:
            self._native.observer.set_step(self.steps.step)
            hand_groups(self._native.observer)  # groups made since
        if self._stats is not None:
            self._stats.clear()
        self.flush()
        if self._index is not None:
            self._index.flush()

    def finish(self) -> None:
        if os.getpid() != self._pid:
            # A child forked inside the capture (os.fork) ends its copy of it: the parent writes the
            # index, parts and meta.json; the child's would overwrite them with its own counts.
            self._native = None
            return
        if self._native is not None:  # every line on disk before meta.json says the capture is whole
            self.drain_native()
            if self._index is not None:
                self._index.flush()  # nothing written through it: the C++ thread appends to the file
            self._native.observer.close_index()
            self.index_waits = self._native.observer.waits()
            if self.mode == "full":
                self._n_parts, self.write_waits = self._native.observer.parts(), self._native.observer.write_waits()
        self._native = None
        self.flush()
        if self._writer is not None:  # every part handed over is on disk before meta.json says the capture is whole
            writer, self._writer = self._writer, None
            writer.close()
        self.transfers.resolve_all(self.quiet)
        if self.transfers.records:
            write_transfers(self.path, self.transfers.records)
        self._steps_log.close()
        if self._index is not None:
            self._index.close()
            self._index = None
        meta = {
            "format": FORMAT, "version": VERSION, "bulk": self.bulk, "mode": self.mode, "rank": self.rank.get(),
            "hook": self.hook_used, "index_waits": self.index_waits, "write_waits": self.write_waits,
            "torch": torch.__version__,
            "selector": self.selector.to_dict(), "max_bytes": self.max_bytes, "bytes_written": self.bytes_written,
            "n_records": self.n_records, "n_ops_seen": self.n_ops, "n_dropped": self.n_dropped,
            "seconds": round(time.time() - self._t0, 3),
            STATE_META: {"roots": self._state_roots, "inputs": self._input_names,
                         "trained_before": self._trained_before, "first_step": self._first_step},
        }
        with open(os.path.join(self.path, META), "w") as f:
            json.dump(meta, f, indent=1)
        log.info("capture: %d ops (%d bytes) written to %s", self.n_records, self.bytes_written, self.path)
