"""In-memory redundant snapshots of an elastic round's training state (as Gemini and ElasWave keep them).

Every `every` steps each rank of the plan copies the slices a checkpoint would have it write (fp32 master weight
and Adam's two moments of its TP slice, one replica per stage; heteropp.engine.checkpoint's slots) and sends
them, from a background thread while training goes on, to two snapshot keepers (heteropp.engine.snapshot_keeper):
its own host's and the next host's (hosts in the order of their first world rank), so one host's loss leaves a
copy of each stage's state on another host. Rank 0 adds what trainer.json holds (optimizer step, schedule, loss
scale).

The next round's rank 0 asks the keepers of the hosts present what they hold; a snapshot (round, step) is whole
when every rank of its plan is found on some keeper. The newest whole snapshot no older than the newest disk
checkpoint is resumed from, each rank fetching only the pieces that overlap its new slices (any plan: stage
split, TP, DP, chip types, as DCP reshards a checkpoint); otherwise the disk checkpoint is. `RoundHooks` also
times the round's phases for elastic.jsonl.
"""
from __future__ import annotations

import hmac
import logging
import math
import socket
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from .checkpoint import Checkpointer, Slot
from .snapshot_keeper import KINDS, new_nonce, proof, read_frame, write_frame

log = logging.getLogger("heteropp")
CONNECT_S = 2.0  # a keeper that does not answer within this is taken for gone
MAX_REPLY = 1 << 40


def ask(addr: str, header: dict[str, Any], payload: bytes = b"",
        timeout: float = 30.0) -> tuple[dict[str, Any], bytearray]:
    """One request to the keeper at ADDR:PORT; raises OSError if it is unreachable, RuntimeError if it refuses or
    cannot prove it holds the job's key (then nothing it sent is used)."""
    host, _, port = addr.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=CONNECT_S) as s:
        s.settimeout(timeout)
        hello, _ = read_frame(s, 0)
        theirs, mine = str(hello.get("nonce", "")), new_nonce()
        write_frame(s, {**header, "nonce": mine, "proof": proof("rank", theirs, mine)}, payload)
        reply, data = read_frame(s, MAX_REPLY)
    if not reply.get("ok"):
        raise RuntimeError(f"snapshot keeper {addr}: {reply.get('error')}")
    if not hmac.compare_digest(str(reply.get("proof", "")), proof("keeper", theirs, mine)):
        raise RuntimeError(f"snapshot keeper {addr} did not prove it holds this job's key (DICOMM_JOB_SECRET): "
                           f"its reply is not used")
    return reply, data


def hosts_of(keepers: list[str | None]) -> list[str]:
    """The distinct keepers of the round's world ranks, in the order of their first rank."""
    return list(dict.fromkeys(k for k in keepers if k))


def peer_of(mine: str, hosts: list[str]) -> str | None:
    """The keeper that holds this host's second copy: the next host's (None with one host)."""
    if len(hosts) < 2 or mine not in hosts:
        return None
    return hosts[(hosts.index(mine) + 1) % len(hosts)]


def choose(keepers: list[str], newer_than: int) -> dict[str, Any] | None:
    """The newest whole snapshot on these keepers at a step >= `newer_than` (the newest disk checkpoint's), with
    where each rank's pieces are; None if there is none."""
    found: dict[tuple[str, int], dict[str, Any]] = {}
    for addr in keepers:
        try:
            reply, _ = ask(addr, {"op": "index"}, timeout=10.0)
        except (OSError, RuntimeError) as e:
            log.warning("snapshot keeper %s: %s", addr, e)
            continue
        for h in reply["snapshots"]:
            snap = found.setdefault((h["round"], h["step"]), {"round": h["round"], "round_t": h["round_t"],
                                                             "step": h["step"], "ranks": h["ranks"], "where": {},
                                                             "pieces": {}, "meta": None})
            r = str(h["rank"])
            snap["where"].setdefault(r, []).append(addr)
            snap["pieces"][r] = h["pieces"]
            if h["rank"] == 0:
                snap["meta"] = h["meta"]
    whole = [s for s in found.values() if s["step"] >= newer_than and s["meta"] is not None
             and set(s["where"]) == {str(r) for r in range(s["ranks"])}]
    return max(whole, key=lambda s: (s["step"], s["round_t"])) if whole else None


def _region(p: dict[str, Any] | Slot, shape: list[int] | tuple[int, ...], dim: int | None) -> tuple[int, int]:
    """[lo, hi) of a piece or slot along `dim` (the whole length where it is not split along it)."""
    own = p["dim"] if isinstance(p, dict) else p.dim
    start = p["start"] if isinstance(p, dict) else p.start
    full = p["full"] if isinstance(p, dict) else list(p.full)
    if dim is None:
        return 0, 1
    return (start, start + shape[dim]) if own == dim else (0, full[dim])


def _overlap(s: Slot, shape: list[int], p: dict[str, Any]) -> tuple[int | None, int, int, int, int]:
    """(dim, lo, hi, lo_t, lo_p): where piece `p` and this rank's slot `s` (of `shape`) share values along the
    dimension they are split on; hi <= lo when they share none."""
    dim = s.dim if s.dim is not None else p["dim"]
    lo_t, hi_t = _region(s, shape, dim)
    lo_p, hi_p = _region(p, p["shape"], dim)
    return dim, max(lo_t, lo_p), min(hi_t, hi_p), lo_t, lo_p


class MemorySource:
    """A whole snapshot as Checkpointer.load's stand-in for `resume`: fills this rank's slices from the keepers."""

    def __init__(self, snap: dict[str, Any], slots: list[Slot]) -> None:
        self.snap, self.slots = snap, slots

    def load(self, opt_state: dict[str, list[torch.Tensor]]) -> dict[str, Any]:
        snap = self.snap
        need: dict[str, set[int]] = {}  # rank -> indices of its pieces that overlap a slot here
        by_key: dict[tuple[str, str], list[tuple[str, int]]] = {}
        for r, pieces in snap["pieces"].items():
            for i, p in enumerate(pieces):
                by_key.setdefault((p["key"], p["kind"]), []).append((r, i))
        for sl in self.slots:
            for kind in KINDS:
                if (sl.key, kind) not in by_key:
                    raise RuntimeError(f"the snapshot of step {snap['step']} has no {kind} of {sl.key}")
                shape = list(opt_state[kind][sl.index].shape)
                for r, i in by_key[(sl.key, kind)]:
                    _, lo, hi, _, _ = _overlap(sl, shape, snap["pieces"][r][i])
                    if hi > lo:
                        need.setdefault(r, set()).add(i)
        got: dict[tuple[str, str], list[tuple[dict[str, Any], torch.Tensor]]] = {}
        for r, indices in need.items():
            reply, data = self._fetch(r, sorted(indices))
            for p in reply["pieces"]:
                t = torch.frombuffer(data, dtype=torch.float32, count=p["nbytes"] // 4, offset=p["offset"]) \
                    if p["nbytes"] else torch.empty(0)
                got.setdefault((p["key"], p["kind"]), []).append((p, t.view(p["shape"])))
        for s in self.slots:
            for kind in KINDS:
                target = opt_state[kind][s.index]
                covered = 0
                for p, t in got.get((s.key, kind), []):
                    dim, lo, hi, lo_t, lo_p = _overlap(s, list(target.shape), p)
                    if hi <= lo:
                        continue
                    if dim is None:
                        target.copy_(t)
                    else:
                        target.narrow(dim, lo - lo_t, hi - lo).copy_(t.narrow(dim, lo - lo_p, hi - lo))
                    covered += (hi - lo) * (math.prod(target.shape) // max(1, target.shape[dim]) if dim is not None
                                            else math.prod(target.shape))
                if covered != target.numel():
                    raise RuntimeError(f"the snapshot of step {snap['step']} covers {covered} of {target.numel()} "
                                       f"values of {kind} {s.key} here")
        return {**snap["meta"], "step": snap["step"]}

    def _fetch(self, rank: str, indices: list[int]) -> tuple[dict[str, Any], bytearray]:
        errors = []
        for addr in self.snap["where"][rank]:
            try:
                return ask(addr, {"op": "get", "round": self.snap["round"], "step": self.snap["step"],
                                  "rank": int(rank), "pieces": indices})
            except (OSError, RuntimeError) as e:
                errors.append(f"{addr}: {e}")
        raise RuntimeError(f"no keeper gave rank {rank}'s snapshot of step {self.snap['step']}: {'; '.join(errors)}")


class RoundHooks:
    """What an elastic round adds to worker.train: where to resume from, the snapshots, the phase times."""
    current: ClassVar["RoundHooks | None"] = None

    def __init__(self, round_id: str, round_t: float, rank: int, ranks: int, keepers: list[str], every: int,
                 chosen: dict[str, Any] | None, phases: dict[str, float], on_resumed: Any) -> None:
        self.round_id, self.round_t, self.rank, self.ranks = round_id, round_t, rank, ranks
        self.keepers, self.every, self.chosen = keepers, every, chosen
        self.phases, self.on_resumed = phases, on_resumed  # on_resumed(phases, source, step, fallback): rank 0 records
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="snapshot") if keepers and every else None
        self.pending: Future[None] | None = None
        self.first: int | None = None  # the first step trained this round
        self.source_name = "none"
        self.fallback = ""  # why a chosen snapshot was not resumed from
        self.step_from = 0

    def source(self, ckpt: Checkpointer) -> Any:
        hooks = self

        class Timed:
            def load(self, state: dict[str, list[torch.Tensor]], path: Any = None) -> dict[str, Any]:
                hooks.phases["load_start"] = time.time()
                meta, why = None, ""
                if hooks.chosen is not None:
                    try:
                        meta = MemorySource(hooks.chosen, ckpt.slots).load(state)
                    except (OSError, RuntimeError) as e:  # a keeper gone since, or refusing this rank
                        why = f"rank {hooks.rank}: {e}"
                    # every rank resumes from the same place: from memory only if every rank got its slices
                    ok = torch.tensor([0 if meta is None else 1])
                    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
                    if not ok.item():
                        meta = None
                        hooks.fallback = why or "another rank could not fetch its slices"
                hooks.source_name = "memory" if meta is not None else "disk"
                if meta is None:
                    meta = ckpt.load(state)
                hooks.step_from = int(meta["step"])
                hooks.phases["load_end"] = time.time()
                return meta
        return Timed()

    def after_step(self, step: int, opt: Any, ckpt: Checkpointer, trainer: dict[str, Any]) -> None:
        if self.first is None:
            self.first = step
            self.phases["first_step_end"] = time.time()
            if self.rank == 0:
                self.on_resumed(self.phases, self.source_name, self.step_from, self.fallback)
        if self.pool is None or step % self.every:
            return
        state = opt.full_state()  # a collective over the DP group: every rank of the plan is here at this step
        pieces, blobs, off = [], [], 0
        for s in ckpt.slots:
            if not s.writes:
                continue
            for kind in KINDS:
                t = state[kind][s.index].detach().to("cpu", torch.float32, copy=True).contiguous()
                nbytes = t.numel() * 4
                pieces.append({"key": s.key, "kind": kind, "dtype": "float32", "shape": list(t.shape),
                               "full": list(s.full), "dim": s.dim, "start": s.start, "offset": off, "nbytes": nbytes})
                blobs.append(t)
                off += nbytes
        header = {"op": "put", "round": self.round_id, "round_t": self.round_t, "step": step, "rank": self.rank,
                  "ranks": self.ranks, "meta": {**trainer, "step": step} if self.rank == 0 else None,
                  "pieces": pieces}
        self.wait()  # one snapshot in flight per rank: the one before is held whole before this one is sent
        self.pending = self.pool.submit(self._send, header, blobs)

    def _send(self, header: dict[str, Any], blobs: list[torch.Tensor]) -> None:
        payload = b"".join(t.numpy().tobytes() for t in blobs)
        for addr in self.keepers:
            try:
                ask(addr, header, payload)
            except (OSError, RuntimeError) as e:  # a lost copy; the round's failure, if any, is found elsewhere
                log.warning("snapshot of step %d to %s: %s", header["step"], addr, e)

    def wait(self) -> None:
        """Until this rank's snapshot in flight is sent: worker.train calls it before the step's all-reduce over
        every rank (the straggler watch's), so a snapshot of step s is whole before step s + 1 is logged."""
        if self.pending is not None:
            self.pending.result()
            self.pending = None

    def close(self) -> None:
        self.wait()
        if self.pool is not None:
            self.pool.shutdown()

