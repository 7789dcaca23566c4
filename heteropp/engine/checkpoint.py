"""Training checkpoints with torch.distributed.checkpoint, independent of the plan that wrote them.

Keys are HuggingFace parameter names with the parameters' full shapes: `<name>` (fp32 master weight),
`optim.exp_avg.<name>`, `optim.exp_avg_sq.<name>`. Each rank writes only its own TP slice (as a
ShardedTensor chunk at its offset), one replica of each stage writes, a TP-replicated key/value slice is
written once and a tied output head (the embedding's copy) not at all; DCP reads back whatever slice a rank
of any later plan holds. `trainer.json` beside the tensor files holds the rest: step, model, dtype, learning-
rate schedule, loss scale, data source and a SHA-256 of every file.

A checkpoint is written into `step-NNNNNNNN.partial/` and renamed to `step-NNNNNNNN/` by rank 0 once every
rank's files and trainer.json are complete, so a crash mid-save leaves the previous checkpoint loadable and
the broken one recognisably incomplete; older complete checkpoints are removed only after a newer one is
complete. With `async_save` the files are written by DCP's background thread while the next step trains, and
the checkpoint is complete before that step is logged (`settle`).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import warnings
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..spec import ModelSpec, SpecError
from ..spec.hf import hf_name
from ..model.init import global_slice

FORMAT = 1
TRAINER = "trainer.json"
_STEP_DIR = re.compile(r"^step-(\d{8})$")


@dataclasses.dataclass
class Slot:
    """One parameter of this rank as the checkpoint sees it."""
    key: str  # HF name
    param: torch.nn.Parameter
    index: int  # position in the optimizer's parameter list
    full: tuple[int, ...]
    dim: int | None
    start: int
    writes: bool  # this rank writes the slice (others holding the same slice read it only)


def slots(named: list[tuple[str, torch.nn.Parameter]], m: ModelSpec, tp_rank: int, tp_size: int,
          first_replica: bool, skip_tied_copy: bool) -> list[Slot]:
    """`first_replica`: this rank is in the one replica of its stage that writes (replica 0; in a plan of replica
    groups, of the first group, which like every group holds every parameter)."""
    out = []
    for i, (name, p) in enumerate(named):
        full, dim, start, _ = global_slice(p, tp_rank, tp_size)
        copy = skip_tied_copy and name.endswith("head.weight")
        first_holder = tp_rank % getattr(p, "tp_replicas", 1) == 0 and (dim is not None or tp_rank == 0)
        out.append(Slot(hf_name(name, m), p, i, full, dim, start, first_replica and first_holder and not copy))
    return out


# DCP's resharding of plain ShardedTensors is what a plan-independent checkpoint needs; torch's advice (DTensor)
# needs one device mesh per stage, which heterogeneous TP sizes do not have.
warnings.filterwarnings("ignore", message="Please use DTensor instead", category=FutureWarning)


def _sharded(t: torch.Tensor, s: Slot) -> Any:
    if s.dim is None or tuple(t.shape) == s.full:
        return t
    from torch.distributed._shard.metadata import ShardMetadata
    from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor
    from torch.distributed._shard.sharded_tensor.metadata import ShardedTensorMetadata, TensorProperties
    # The global metadata must tile the whole tensor; DCP itself reads only the local shard and the full
    # size, so the other slices name any other rank (they are never written from here).
    me, world = dist.get_rank(), dist.get_world_size()
    n = t.shape[s.dim]
    mds, mine = [], None
    for j in range(s.full[s.dim] // n):
        offsets = [0] * len(s.full)
        offsets[s.dim] = j * n
        md = ShardMetadata(shard_offsets=offsets, shard_sizes=list(t.shape),
                           placement=f"rank:{me if j * n == s.start else (me + 1) % world}/cpu")
        mine = md if j * n == s.start else mine
        mds.append(md)
    props = TensorProperties(dtype=t.dtype, layout=torch.strided, requires_grad=False,
                             memory_format=torch.contiguous_format, pin_memory=False)
    meta = ShardedTensorMetadata(shards_metadata=mds, size=torch.Size(s.full), tensor_properties=props)
    return ShardedTensor._init_from_local_shards_and_global_metadata([Shard(t, mine)], meta)


def _keys(s: Slot) -> tuple[str, str, str]:
    return s.key, f"optim.exp_avg.{s.key}", f"optim.exp_avg_sq.{s.key}"


def _state_dict(sl: list[Slot], tensors: dict[str, list[torch.Tensor]], writing: bool) -> dict[str, Any]:
    sd: dict[str, Any] = {}
    for s in sl:
        if writing and not s.writes:
            continue
        for key, kind in zip(_keys(s), ("master", "exp_avg", "exp_avg_sq")):
            t = tensors[kind][s.index]
            sd[key] = _sharded(t.detach().to("cpu", copy=True).contiguous() if writing else t, s)
    return sd


def complete_checkpoints(root: str | Path) -> list[Path]:
    """Complete checkpoints under `root`, oldest first."""
    r = Path(root)
    if not r.is_dir():
        return []
    found = [p for p in r.iterdir() if _STEP_DIR.match(p.name) and (p / TRAINER).is_file()]
    return sorted(found, key=lambda p: p.name)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class Checkpointer:
    """Saves and loads one rank's part of the training state; every rank of the job calls each method."""

    def __init__(self, root: str, m: ModelSpec, sl: list[Slot], pg: Any = None, keep: int = 2,
                 async_save: bool = True) -> None:
        self.root, self.m, self.slots, self.pg, self.keep = Path(root), m, sl, pg, keep
        self.distributed = dist.is_available() and dist.is_initialized()
        self.lead = not self.distributed or dist.get_rank() == 0
        self.async_save = async_save and self.distributed
        self.pending: tuple[Future, Path, dict[str, Any]] | None = None

    # -- save ----------------------------------------------------------------------------------------
    def save(self, step: int, opt_state: dict[str, list[torch.Tensor]], trainer: dict[str, Any]) -> None:
        """Start writing the state after `step` (waits for the previous save first)."""
        self.wait()
        partial = self.root / f"step-{step:08d}.partial"
        if self.lead:
            shutil.rmtree(partial, ignore_errors=True)  # a crashed attempt at the same step
            partial.mkdir(parents=True)
        self._barrier()
        sd = _state_dict(self.slots, opt_state, writing=True)
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint import FileSystemWriter
        writer = FileSystemWriter(str(partial), thread_count=1, sync_files=True)
        meta = {**trainer, "step": step, "format": FORMAT, "model": dataclasses.asdict(self.m)}
        if self.async_save:
            fut = dcp.async_save(sd, storage_writer=writer, process_group=self.pg)
            self.pending = (fut, partial, meta)  # type: ignore[assignment]
        else:
            dcp.save(sd, storage_writer=writer, process_group=self.pg, no_dist=not self.distributed)
            self._finish(partial, meta)

    def settle(self) -> None:
        """Complete the background save started after the previous step, waiting for it if need be; every rank
        calls this before the next step is logged. A save so overlaps one step at most, and a failure at any
        moment loses at most one checkpoint interval (unsettled, a save still being written when a host died
        left the checkpoint before it as the newest: one interval and the steps since the save)."""
        if self.pending is None:
            return
        self.wait()
        self._barrier()  # rank 0 renamed the checkpoint into place before any rank logs the step

    def wait(self) -> None:
        if self.pending is None:
            return
        fut, partial, meta = self.pending
        self.pending = None
        fut.result()  # raises what the background save raised
        self._finish(partial, meta)

    def _finish(self, partial: Path, meta: dict[str, Any]) -> None:
        """Rank 0: DCP's coordinator wrote `.metadata` after every rank's files, so the checkpoint is whole."""
        if not self.lead:
            return
        meta["files"] = {p.name: _sha256(p) for p in sorted(partial.iterdir()) if p.is_file()}
        tmp = partial / (TRAINER + ".tmp")
        tmp.write_text(json.dumps(meta, indent=1))
        os.replace(tmp, partial / TRAINER)
        final = partial.with_name(partial.name[: -len(".partial")])
        if final.exists():  # the same step saved again (a resumed run): replace it only now
            old = final.with_name(final.name + ".old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
            os.replace(partial, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(partial, final)
        for stale in complete_checkpoints(self.root)[: -self.keep]:
            shutil.rmtree(stale, ignore_errors=True)

    def _barrier(self) -> None:
        if self.distributed:
            dist.barrier(group=self.pg)

    # -- load ----------------------------------------------------------------------------------------
    def load(self, opt_state: dict[str, list[torch.Tensor]], path: Path | None = None) -> dict[str, Any]:
        """Fill `opt_state` (ZeroAdamW.full_state's layout, this rank's slices) from the newest complete
        checkpoint (or `path`); returns its trainer.json. A checkpoint of another model, a missing key or a
        file whose bytes changed is refused with SpecError naming it."""
        path = path or self.newest()
        if path is None:
            raise SpecError(str(self.root), "<checkpoint>", "no complete checkpoint to resume from",
                            "a directory holding step-NNNNNNNN/ checkpoints written by heteropp")
        # rank 0 reads every file once to check its hash; the others wait for its verdict instead of each
        # reading the whole checkpoint again
        meta = read_trainer(path, self.m, verify=self.lead)
        self._barrier()
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint import FileSystemReader
        reader = FileSystemReader(str(path))
        saved = reader.read_metadata().state_dict_metadata
        for s in self.slots:
            for key in _keys(s):
                if key not in saved:
                    raise SpecError(str(path), key, "missing from the checkpoint", "a checkpoint of this model")
                size = tuple(getattr(saved[key], "size", ()))
                if size != s.full:
                    raise SpecError(str(path), key, f"shape {list(size)} in the checkpoint",
                                    f"{list(s.full)} for this model")
        sd = _state_dict(self.slots, opt_state, writing=False)
        try:
            dcp.load(sd, storage_reader=reader, process_group=self.pg, no_dist=not self.distributed)
        except Exception as e:  # DCP wraps each rank's read error; name the checkpoint
            raise SpecError(str(path), "<tensor files>", f"cannot be read: {str(e).splitlines()[0]}",
                            "an intact checkpoint") from None
        return meta

    def newest(self) -> Path | None:
        done = complete_checkpoints(self.root)
        return done[-1] if done else None


def read_trainer(path: Path, m: ModelSpec | None = None, verify: bool = True) -> dict[str, Any]:
    """trainer.json of a complete checkpoint, checked against the model and against its files' hashes."""
    f = path / TRAINER
    try:
        meta = json.loads(f.read_text())
    except (OSError, ValueError) as e:
        raise SpecError(str(f), "<file>", f"unreadable ({e})", "a checkpoint written by heteropp") from None
    if meta.get("format") != FORMAT:
        raise SpecError(str(f), "format", f"got {meta.get('format')!r}", f"{FORMAT}")
    if m is not None:
        mine = dataclasses.asdict(m)
        theirs = meta.get("model", {})
        diff = [k for k in mine if k != "name" and k != "seq_len" and theirs.get(k) != mine[k]]
        if diff:
            k = diff[0]
            raise SpecError(str(path), f"model.{k}", f"the checkpoint's model has {k}={theirs.get(k)!r}",
                            f"{mine[k]!r} as this run's model (a checkpoint of another model)")
    if verify:
        for name, digest in meta.get("files", {}).items():
            p = path / name
            if not p.is_file() or _sha256(p) != digest:
                raise SpecError(str(p), "<file>", "missing or its bytes changed since the checkpoint was written",
                                "an intact checkpoint (its SHA-256 is in trainer.json)")
    return meta
