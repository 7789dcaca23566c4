"""Point-to-point transfers (send, recv, and isend/irecv/batch_isend_irecv, which issue the same
ops) checked across ranks: a checksum of the bytes a rank sent and of the bytes its peer received,
matched by (source, destination, tag, sequence number), the sequence counting the transfers between
the two ranks on that tag in issue order (the order in which a backend delivers them).

A sent tensor is read when the send is issued. A receive is never waited for by a tool (gloo counts
waits on its Work: a second wait waits for a transfer that never comes), so its buffer is read when
the program first uses it (the first op, other than a view, that reads or writes its storage: the
program must have waited by then) or, if it never does, when the check runs."""
from __future__ import annotations

import hashlib
import json
import os
from collections import defaultdict

import torch
from torch.utils._pytree import tree_leaves

from .bulk import storage_address
from .dump import checked_lines
from .summaries import tensor_checksum

SEND = "c10d::send"
RECEIVE = ("c10d::recv_", "c10d::recv_any_source_")
FILE = "transfers.jsonl"  # a capture's transfer records, one JSON object a line


def checksum(tensors: list[torch.Tensor]) -> str:
    """One hash of the tensors' bytes and dtypes, whatever their shapes (a receiver may use another)."""
    h = hashlib.blake2b(digest_size=16)
    for t in tensors:
        h.update(tensor_checksum(t.detach().reshape(-1)).encode())
    return h.hexdigest()


def transfer_record(op: str, args, group: list[int] | None) -> dict:
    """Peer (a global rank; None for a receive from any source, until it completes) and tag."""
    any_source = op == "c10d::recv_any_source_"
    peer = None if any_source else int(args[2])
    if peer is not None and group:
        peer = group[peer]
    return {"peer": peer, "tag": int(args[2] if any_source else args[3]), "group": group}


class TransferLog:
    """A tool's record of its transfers: ``run`` issues one and records it; ``before_op`` (every op,
    before it runs) and ``resolve_all`` (at the check) read the receives' buffers. The C++ op hook
    records through ``sent``, ``received`` and ``touched`` (native_hook.hand_transfers)."""

    def __init__(self) -> None:
        self.records: list[dict] = []
        self._receives = PendingReceives()

    def run(self, rec: dict, func, args, kwargs, group: list[int] | None, quiet):
        """Issue the transfer ``func`` (``quiet``: the tool's context for its own ops); returns its output."""
        if rec["op"] == SEND:
            with quiet():
                self.sent(rec, args, group)
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        self.received(rec, args, group, out)
        return out

    def sent(self, rec: dict, args, group: list[int] | None) -> None:
        """A send about to be issued (``args``: its arguments): what it sends is read now."""
        self.records.append(self._record(rec, args, group, checksum(args[0])))

    def received(self, rec: dict, args, group: list[int] | None, out) -> None:
        """A receive issued (``out``: its Work): its buffer is read later."""
        record = self._record(rec, args, group, None)
        self._receives.add(record, args[0], out)
        self.records.append(record)

    @staticmethod
    def _record(rec: dict, args, group: list[int] | None, check: str | None) -> dict:
        return {**rec, **transfer_record(rec["op"], args, group), "check": check}

    @property
    def waiting(self) -> bool:
        """Receives whose buffers have not been read yet (``before_op`` has work to do)."""
        return bool(self._receives)

    def unread_storages(self) -> list[int]:
        """The storage addresses of the receives' buffers not read yet."""
        return sorted(self._receives.storages)

    def before_op(self, info, args, kwargs, quiet) -> None:
        if self._receives and not info.is_view:  # the program has waited for what it uses
            with quiet():
                self.touched((args, kwargs))

    def touched(self, tensors) -> None:
        """An op (not a view) about to run on ``tensors`` (any nesting): the receives' buffers that
        share storage with them are read now."""
        self._receives.resolve_touched(tensors)

    def resolve_all(self, quiet) -> None:
        with quiet():
            self._receives.resolve_all()  # buffers the program never used: read now


class PendingReceives:
    """Receives whose buffers have not been read yet."""

    def __init__(self) -> None:
        self._items: list[tuple[dict, list[torch.Tensor], object]] = []
        self.storages: set[int] = set()

    def __bool__(self) -> bool:
        return bool(self._items)

    def add(self, record: dict, tensors: list[torch.Tensor], out) -> None:
        self._items.append((record, list(tensors), out))
        self.storages.update(_storage(t) for t in tensors)
        self.storages.discard(None)

    def resolve_touched(self, tensors) -> None:
        """Read the buffers that the op's ``tensors`` (any nesting) share storage with (before it runs)."""
        touched = {_storage(t) for t in tree_leaves(tensors) if isinstance(t, torch.Tensor)} & self.storages
        if touched:
            self._resolve(lambda tensors: any(_storage(t) in touched for t in tensors))

    def resolve_all(self) -> None:
        self._resolve(lambda tensors: True)

    def _resolve(self, chosen) -> None:
        keep = []
        for record, tensors, out in self._items:
            if not chosen(tensors):
                keep.append((record, tensors, out))
                continue
            record["check"] = checksum(tensors)
            if record["peer"] is None:  # any source: known once completed
                record["peer"] = _source_rank(out, record.get("group"))
        self._items = keep
        self.storages = {_storage(t) for _, tensors, _ in keep for t in tensors} - {None}


def _storage(t: torch.Tensor) -> int | None:
    """Its storage's address; None without one of its own (a wrapper subclass, a meta tensor)."""
    try:
        return storage_address(t) or None
    except RuntimeError:
        return None


def _source_rank(out, group: list[int] | None) -> int | None:
    for leaf in tree_leaves(out):
        if isinstance(leaf, torch.ScriptObject):
            try:
                src = int(torch._C._distributed_c10d.Work.unbox(leaf)._source_rank())
            except (RuntimeError, TypeError, AttributeError):
                return None
            return group[src] if group else src
    return None


def check_transfers(per_rank: dict[int, list[dict]]) -> list[dict]:
    """One row per transfer: the k-th send from src to dst on a tag against the k-th receive of dst
    from src on that tag."""
    sends: dict[tuple, list[dict]] = defaultdict(list)
    receives: dict[tuple, list[dict]] = defaultdict(list)
    rows = []
    for rank in sorted(per_rank):
        for c in per_rank[rank]:
            if c["op"] == SEND:
                sends[(rank, c["peer"], c["tag"])].append(c)
            elif c.get("peer") is None:
                rows.append(_row(c, None, rank, c["tag"], None, "skipped",
                                 f"rank {rank} received from any source and its source is not known"))
            else:
                receives[(c["peer"], rank, c["tag"])].append(c)
    for key in sorted(set(sends) | set(receives), key=str):
        src, dst, tag = key
        sent, got = sends.get(key, []), receives.get(key, [])
        for seq in range(max(len(sent), len(got))):
            where = f"transfer #{seq} from rank {src} to rank {dst} on tag {tag}"
            if seq >= len(got):
                status, detail = "fail", f"{where}: rank {src} sent it, rank {dst} received only {len(got)}"
            elif seq >= len(sent):
                status, detail = "fail", f"{where}: rank {dst} received it, rank {src} sent only {len(sent)}"
            elif got[seq].get("check") is None:
                status, detail = "skipped", f"{where}: rank {dst}'s buffer was never read"
            elif got[seq]["check"] != sent[seq]["check"]:
                status, detail = "fail", f"{where}: rank {dst} received other bytes than rank {src} sent"
            else:
                status, detail = "pass", f"{where}: rank {dst} received the bytes rank {src} sent"
            rows.append(_row(sent[seq] if seq < len(sent) else got[seq], src, dst, tag, seq, status, detail))
    return rows


def _row(c: dict, src, dst, tag, seq, status: str, detail: str) -> dict:
    row = {key: c.get(key) for key in ("index", "op", "phase", "module", "step")}
    row.update(rank=None, src=src, dst=dst, tag=tag, seq=seq, rule="point_to_point", status=status, detail=detail)
    return row


def write_transfers(directory: str, records: list[dict]) -> None:
    with open(os.path.join(directory, FILE), "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


def load_transfers(directory: str) -> list[dict]:
    """A capture's transfer records (none if it has no ``transfers.jsonl``), each field checked."""
    path = os.path.join(directory, FILE)
    if not os.path.isfile(path):
        return []
    return list(checked_lines(path, _bad_transfer))


def _bad_transfer(rec) -> str | None:
    def is_int(v) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    if not isinstance(rec, dict):
        return "expected a JSON object"
    if rec.get("op") not in (SEND, *RECEIVE):
        return f"field 'op' is {rec.get('op')!r:.40}, expected {SEND} or one of {', '.join(RECEIVE)}"
    if not is_int(rec.get("tag")) or not is_int(rec.get("index")):
        return "fields 'tag' and 'index' must be integers"
    if rec.get("peer") is not None and not is_int(rec["peer"]):
        return f"field 'peer' is {rec['peer']!r:.40}, expected an integer or null"
    if rec.get("check") is not None and not isinstance(rec["check"], str):
        return f"field 'check' is {rec['check']!r:.40}, expected a string or null"
    return None
