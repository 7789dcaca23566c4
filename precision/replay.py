"""Replay one captured op on another device (and/or dtype) and compare with what was captured."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .dump import Dump, check_replayable
from .metrics import TreeVerdict, compare_trees
from .records import resolve_op
from .reference import run_reference, skip_reason


@dataclass
class ReplayResult:
    index: int
    op: str
    module: str | None
    device: str
    dtype: str | None
    verdict: TreeVerdict
    note: str = ""

    def to_dict(self) -> dict:
        return {"index": self.index, "op": self.op, "module": self.module, "device": self.device,
                "dtype": self.dtype, "note": self.note, **self.verdict.summary(),
                "outputs": [v.to_dict() for v in self.verdict.verdicts]}


def replay(dump: Dump | str, index: int, device: str = "cpu", dtype: torch.dtype | None = None,
           rtol: float | None = None, atol: float | None = None) -> ReplayResult:
    """Run captured op ``index`` again on ``device`` (floating inputs cast to ``dtype`` if given);
    the captured outputs are compared against the replay's, with the captured dtype's tolerances."""
    dump = Dump.open(dump) if isinstance(dump, str) else dump
    rec = dump.record(index)
    data = dump.load(rec)
    if data is None:
        raise ValueError(f"{dump.path}: op {rec['op']} #{index} was indexed without tensors (size cap or "
                         "save_tensors=False); capture it again with a larger max_bytes")
    check_replayable((data["args"], data["kwargs"]), f"{dump.path}: op {rec['op']} #{index}")
    func = resolve_op(rec["op"], rec.get("overload", "default"))
    out = run_reference(func, data["args"], data["kwargs"], device, dtype)
    out = torch.utils._pytree.tree_map(lambda t: t.to("cpu") if isinstance(t, torch.Tensor) else t, out)
    note = f"{skip_reason(func)}: a difference is expected" if skip_reason(func) else ""
    verdict = compare_trees(data["outputs"], out, rtol=rtol, atol=atol)
    return ReplayResult(int(rec["index"]), rec["op"], rec.get("module"), str(device),
                        str(dtype).removeprefix("torch.") if dtype else None, verdict, note)
