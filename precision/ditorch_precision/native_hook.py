"""A stats capture's op hook in C++ (``native``'s OpObserver): the ops a Python dispatch mode would
show are seen by a RecordFunction callback instead, which keeps each op's index line as a binary
record (its statistics from one fused pass over each output); at each step the capture hands them
to a C++ thread that writes their text to the index file, off the training thread. The Python
per-op path (the dispatch mode, about 1.3x the step of a small LLaMA on its own) is gone; what stays
in Python is per module and per step: the module stack (moved by the capture's module tracker),
the tags of the autograd nodes each module created (kept in C++ by sequence number: the module of a
backward op), the optimizer phase (optimizer hooks) and the point-to-point transfers' records
(``hand_transfers``: a few per step). A full capture in part files (bulk) runs here too, also under
torch.distributed (a collective's tensors saved as the Python hook saves them). Both hooks number
the same ops (tests/precision/test_precision_hook_sequences.py) and write the same transfer records
and collectives (tests/precision/test_precision_transfer_hooks.py).

``choose(capture, wanted)`` says which hook a capture runs ("cpp" or "python") and, for "python",
why; ``NativeHook`` is the context that installs the C++ one."""
from __future__ import annotations

import os
import threading

import torch
import torch.optim.optimizer as optim_hooks

from . import native
from .collectives import ranks_by_name
from .dump import INDEX, readable, tensors_in
from .point_to_point import SEND

HOOKS = ("auto", "cpp", "python")
# Index records the C++ observer's writer thread may hold unwritten (a few hundred bytes each): a
# step handed over beyond that waits for the thread (counted in meta.json's "index_waits").
MAX_QUEUED = 1 << 18
# A full capture's tensor bytes the writer thread may hold unwritten (beyond: the step waits).
MAX_QUEUED_BYTES = 1 << 30
_NONE = object()  # torch.Tensor had no _make_subclass of its own


def why_python(capture) -> str | None:
    """Why ``capture`` cannot run on the C++ observer, or None when it can."""
    sel = capture.selector
    if not native.available():
        return f"the C++ module is not available ({native.why_not()})"
    if capture.mode not in ("stats", "full"):
        return f"mode {capture.mode!r}: the C++ observer writes statistics (mode 'stats') or tensors (mode 'full')"
    if capture.mode == "full" and (not capture.bulk or not capture.save_tensors):
        return "a full capture without bulk part files (bulk=False) or without tensors: the Python path writes it"
    if any(v is not None for v in (sel.ops, sel.exclude_ops, sel.modules, sel.steps, sel.ranks, sel.phases,
                                   sel.apis)):
        return "a selection is set: the C++ observer records every op"
    if capture.with_callsite or capture.with_api:
        return "call sites or torch-level calls are recorded: those are Python frames"
    if _ACTIVE is not None:
        return "another capture holds the C++ observer (one at a time)"
    if torch._C._len_torch_dispatch_stack() > 0:
        return "another dispatch mode is active: its own ops would be seen as the program's"
    return None


def choose(capture, wanted: str) -> tuple[str, str | None]:
    """("cpp" | "python", why Python) for ``wanted`` in HOOKS; "cpp" that cannot run raises."""
    if wanted not in HOOKS:
        raise ValueError(f"capture hook {wanted!r}; expected one of {', '.join(HOOKS)}")
    if wanted == "python":
        return "python", "asked for"
    reason = why_python(capture)
    if reason is None:
        return "cpp", None
    if wanted == "cpp":
        raise ValueError(f"capture hook 'cpp' cannot run: {reason}")
    return "python", reason


class NativeHook:
    """Installs ``capture``'s OpObserver on this thread, with the module, optimizer and step context
    it reads; on exit removes it and hands its last lines to the capture."""

    def __init__(self, capture) -> None:
        self.capture = capture
        self.observer = native.op_observer()
        self._handles: list = []
        self._make_subclass: object = _NONE

    def __enter__(self) -> "NativeHook":
        cap, obs = self.capture, self.observer
        obs.set_rank(cap.rank.get())
        obs.set_step(cap.steps.step)
        tracker = cap.modules
        # Told by the tool's own tracker: the path is named, and (on return) the module record is
        # written, before the observer's stack moves.
        tracker.on_enter, tracker.on_exit = obs.push_module, obs.pop_module
        self._handles = [
            optim_hooks.register_optimizer_step_pre_hook(lambda o, a, k: obs.set_optimizer(True)),
            optim_hooks.register_optimizer_step_post_hook(lambda o, a, k: obs.set_optimizer(False)),
        ]
        tracker.tagger = lambda output, path, seq: obs.tag(tensors_in(output), path, seq)
        hand_groups(obs)
        obs.set_python_side(readable, ranks_by_name)  # a collective's result, a group made mid-step
        hand_transfers(obs, cap.transfers)
        if cap.mode == "full":
            obs.set_full(os.path.join(cap.path, "tensors"), cap.bulk_bytes,
                         -1 if cap.max_bytes is None else cap.max_bytes, MAX_QUEUED_BYTES)
        obs.open_index(os.path.join(cap.path, INDEX), MAX_QUEUED)
        obs.start()
        self._make_subclass = vars(torch.Tensor).get("_make_subclass", _NONE)
        torch.Tensor._make_subclass = _unseen_make_subclass(obs)
        global _ACTIVE
        _ACTIVE = self
        return self

    def __exit__(self, *exc) -> None:
        global _ACTIVE
        _ACTIVE = None
        if self._make_subclass is _NONE:
            del torch.Tensor._make_subclass
        else:
            torch.Tensor._make_subclass = self._make_subclass
        self.observer.stop()
        tracker = self.capture.modules
        tracker.tagger = tracker._tag
        tracker.on_enter = tracker.on_exit = None
        for h in self._handles:
            h.remove()
        self._handles = []
        self.capture.drain_native()



def _unseen_make_subclass(observer) -> staticmethod:
    """``torch.Tensor._make_subclass`` (a Parameter made) detaches its data with every dispatch mode
    put aside: the Python hook never sees that detach, so the C++ observer does not either (paused
    around it). Set as torch.Tensor's own attribute, which shadows torch's, while the hook is in. Only
    the hook's own thread pauses: the observer sees no other thread's ops, and a Parameter made on
    another thread must not hide this thread's ops meanwhile. Wraps the one in place (torch's, or
    another library's own), which still runs."""
    make = torch.Tensor._make_subclass
    hooked = threading.get_ident()

    def make_subclass(*args, **kwargs):
        if threading.get_ident() != hooked:
            return make(*args, **kwargs)
        observer.pause()
        try:
            return make(*args, **kwargs)
        finally:
            observer.resume()

    return staticmethod(make_subclass)


def hand_groups(observer) -> None:
    """The process groups torch.distributed knows (name -> global ranks) and ReduceOp's names, as
    the observer writes a collective's "group" and "reduce_op" (collectives.group_ranks and
    reduce_op_name for the Python hook)."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return
    for name, member in dist.ReduceOp.RedOpType.__members__.items():
        observer.set_reduce_op_name(int(member), name)
    for pg in list(dist.distributed_c10d._world.pg_group_ranks):
        try:
            observer.set_group(pg.group_name, dist.get_process_group_ranks(pg))
        except (RuntimeError, ValueError, AttributeError):  # a group this process is no member of
            continue


def hand_transfers(observer, log) -> None:
    """The observer records point-to-point transfers in ``log`` (the capture's TransferLog, written
    to transfers.jsonl as the Python hook's are): a send's record, with what it sends, before it is
    issued; a receive's once issued; a receive's buffer read before the first op (not a view) on its
    storage. Each call returns the storages of the buffers still unread, which the observer watches."""
    def transfer(rec: dict, args: tuple, group: list[int] | None, out) -> list[int]:
        if rec["op"] == SEND:
            log.sent(rec, args, group)
        else:
            log.received(rec, args, group, out)
        return log.unread_storages()

    def touched(tensors: list[torch.Tensor]) -> list[int]:
        log.touched(tensors)
        return log.unread_storages()

    observer.set_transfers(transfer, touched)


_ACTIVE: NativeHook | None = None  # the observer installed (one at a time)


def paused():
    """A context in which the active C++ observer sees no op (a tool's own work, ``Tool.quiet``),
    or None when none is active."""
    return _Paused(_ACTIVE.observer) if _ACTIVE is not None else None


class _Paused:
    """A capture's own ops (its quiet blocks) are not the program's."""

    def __init__(self, observer) -> None:
        self.observer = observer

    def __enter__(self):
        self.observer.pause()
        return self

    def __exit__(self, *exc) -> None:
        self.observer.resume()
