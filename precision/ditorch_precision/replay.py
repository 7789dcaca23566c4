"""Replay one captured op on another device (and/or dtype) and compare with what was captured."""
from __future__ import annotations

from dataclasses import dataclass

import statistics
import time

import torch
from torch.utils._pytree import tree_leaves

from .dump import Dump, check_replayable
from .metrics import ToleranceTable, TreeVerdict, compare_trees, op_tolerances
from .records import resolve_op
from .reference import convert_inputs, run_reference, skip_reason


@dataclass
class ReplayResult:
    index: int
    op: str
    module: str | None
    device: str
    dtype: str | None
    verdict: TreeVerdict
    note: str = ""
    backward: TreeVerdict | None = None  # input gradients on ``device`` against float64 CPU ones
    timing: dict | None = None  # median milliseconds of forward (and backward) over ``repeat`` runs

    def to_dict(self) -> dict:
        out = {"index": self.index, "op": self.op, "module": self.module, "device": self.device,
               "dtype": self.dtype, "note": self.note, **self.verdict.summary(),
               "outputs": [v.to_dict() for v in self.verdict.verdicts]}
        if self.backward is not None:
            out["backward"] = self.backward.summary()
        if self.timing is not None:
            out["timing"] = self.timing
        return out


def _tolerances(op: str, actual, expected, rtol, atol) -> dict:
    rtol, atol = op_tolerances(ToleranceTable(rtol=rtol, atol=atol), op, actual, expected)
    return {"rtol": rtol, "atol": atol}


def _synchronize(device) -> None:
    module = getattr(torch, torch.device(device).type, None)
    if torch.device(device).type != "cpu" and hasattr(module, "synchronize"):
        module.synchronize()


def _with_grad(args, kwargs, device, dtype):
    """Copies on ``device`` (floating ones in ``dtype``) that require grad, and the list of them."""
    args, kwargs = convert_inputs(args, kwargs, device, dtype)
    leaves = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    for t in leaves:
        t.requires_grad_(True)
    return args, kwargs, leaves


def _forward_backward(func, args, kwargs, device, dtype, grad_seed: int = 0):
    """The op's input gradients for fixed random output gradients (None: the op has none)."""
    a, k, leaves = _with_grad(args, kwargs, device, dtype)
    outs = [t for t in tree_leaves(func(*a, **k)) if isinstance(t, torch.Tensor) and t.requires_grad]
    if not outs or not leaves:
        return None
    g = torch.Generator().manual_seed(grad_seed)
    grads_out = [torch.randn(o.shape, generator=g, dtype=torch.float64).to(o.device, o.dtype) for o in outs]
    grads = torch.autograd.grad(outs, leaves, grads_out, allow_unused=True)
    return [torch.zeros_like(x) if gr is None else gr for x, gr in zip(leaves, grads)]


def _median_ms(fn, device, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        _synchronize(device)
        t0 = time.perf_counter()
        fn()
        _synchronize(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def replay(dump: Dump | str, index: int, device: str = "cpu", dtype: torch.dtype | None = None,
           rtol: float | None = None, atol: float | None = None, backward: bool = False,
           repeat: int = 0) -> ReplayResult:
    """Run captured op ``index`` again on ``device`` (floating inputs cast to ``dtype`` if given);
    the captured outputs are compared against the replay's, with the captured dtype's tolerances.
    ``backward``: also the op's input gradients (for seeded random output gradients) on ``device``
    in the captured dtypes, against float64 CPU ones. ``repeat``: time forward (and backward) that
    many times, synchronised, and report medians."""
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
    verdict = compare_trees(data["outputs"], out, **_tolerances(rec["op"], data["outputs"], out, rtol, atol))
    result = ReplayResult(int(rec["index"]), rec["op"], rec.get("module"), str(device),
                          str(dtype).removeprefix("torch.") if dtype else None, verdict, note)
    args, kwargs = data["args"], data["kwargs"]
    if backward:
        try:
            got = _forward_backward(func, args, kwargs, device, None)
            want = _forward_backward(func, args, kwargs, "cpu", torch.float64)
        except RuntimeError as exc:  # no derivative, in-place on a leaf, ...
            result.note = (result.note + "; " if result.note else "") + f"no backward: {str(exc).splitlines()[0]}"
        else:
            if got is None:
                result.note = (result.note + "; " if result.note else "") + "no backward: nothing requires grad"
            else:
                got = [t.cpu() for t in got]
                result.backward = compare_trees(got, want, **_tolerances(rec["op"], got, want, rtol, atol))
    if repeat:
        fa, fk = convert_inputs(args, kwargs, device, dtype)
        result.timing = {"repeat": repeat, "forward_ms": _median_ms(lambda: func(*fa, **fk), device, repeat)}
        if result.backward is not None:
            result.timing["forward_backward_ms"] = _median_ms(
                lambda: _forward_backward(func, args, kwargs, device, None), device, repeat)
    return result
