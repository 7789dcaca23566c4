"""capture: write the inputs and outputs (forward and backward, so gradients too) of the selected
ops to a directory, up to a size cap."""
from __future__ import annotations

import json
import logging
import os
import time

import torch

from .dump import FORMAT, INDEX, META, VERSION, snapshot, tensors_meta, tree_nbytes
from .records import OpRecord
from .selection import Selector
from .tool import Tool

log = logging.getLogger("precision")


class Capture(Tool):
    """``with Capture("dump/{rank}", Selector.build(modules="layers.1")): train()``.

    ``max_bytes`` caps the tensor bytes written; past it, ops are still indexed (``file: null``)."""

    name = "capture"

    def __init__(self, path: str, selector: Selector | None = None, *, max_bytes: int | None = 1 << 30,
                 save_tensors: bool = True, **kwargs) -> None:
        super().__init__(selector, **kwargs)
        self.path_template = path
        self.path = path
        self.max_bytes = max_bytes
        self.save_tensors = save_tensors
        self.bytes_written = 0
        self.n_records = 0
        self.n_dropped = 0
        self._index = None

    def start(self) -> None:
        self.path = self.path_template.format(rank=self.rank.get())
        os.makedirs(os.path.join(self.path, "tensors"), exist_ok=True)
        self._index = open(os.path.join(self.path, INDEX), "w")
        self._t0 = time.time()

    def handle(self, rec: OpRecord, func, args, kwargs):
        with self.quiet():
            inputs = snapshot((args, kwargs)) if self.save_tensors else None  # before the op: in-place ops
        out = func(*args, **kwargs)
        with self.quiet():
            self._write(rec, args, kwargs, inputs, out)
        return out

    def _write(self, rec: OpRecord, args, kwargs, inputs, out) -> None:
        entry = rec.to_dict()
        entry["inputs"] = tensors_meta((args, kwargs))
        entry["outputs"] = tensors_meta(out)
        entry["file"] = None
        if self.save_tensors:
            outputs = snapshot(out)
            size = tree_nbytes(inputs) + tree_nbytes(outputs)
            if self.max_bytes is None or self.bytes_written + size <= self.max_bytes:
                rel = os.path.join("tensors", f"{rec.index:07d}.pt")
                torch.save({"args": inputs[0], "kwargs": inputs[1], "outputs": outputs}, os.path.join(self.path, rel))
                self.bytes_written += size
                entry["file"] = rel
            else:
                if self.n_dropped == 0:
                    log.warning("capture: size cap of %d bytes reached at op %s #%d; later ops are indexed "
                                "without tensors", self.max_bytes, rec.op, rec.index)
                self.n_dropped += 1
        self._index.write(json.dumps(entry) + "\n")
        self._index.flush()
        self.n_records += 1

    def finish(self) -> None:
        if self._index is not None:
            self._index.close()
            self._index = None
        meta = {
            "format": FORMAT, "version": VERSION, "rank": self.rank.get(), "torch": torch.__version__,
            "selector": self.selector.to_dict(), "max_bytes": self.max_bytes, "bytes_written": self.bytes_written,
            "n_records": self.n_records, "n_ops_seen": self.n_ops, "n_dropped": self.n_dropped,
            "seconds": round(time.time() - self._t0, 3),
        }
        with open(os.path.join(self.path, META), "w") as f:
            json.dump(meta, f, indent=1)
        log.info("capture: %d ops (%d bytes) written to %s", self.n_records, self.bytes_written, self.path)
