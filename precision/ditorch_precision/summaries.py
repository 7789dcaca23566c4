"""Statistics-only and checksum captures: per output tensor a few numbers instead of the tensor, so
a whole network can be captured every step without filling a disk, and their comparison."""
from __future__ import annotations

import hashlib
import math

import torch
from torch.utils._pytree import tree_leaves

from .metrics import default_tolerance

MODES = ("full", "stats", "checksum")
_STATS = ("min", "max", "mean", "norm")


def _tensors(tree) -> list[torch.Tensor]:
    return [t for t in tree_leaves(tree) if isinstance(t, torch.Tensor)]


def tensor_stats(t: torch.Tensor) -> dict:
    """min, max, mean, L2 norm (float64 sums, over finite values) and NaN/Inf counts of one tensor."""
    x = t.detach()
    out: dict = {"dtype": str(x.dtype).removeprefix("torch."), "numel": x.numel()}
    if not x.numel() or x.is_complex() or x.dtype == torch.bool or not (x.is_floating_point() or x.dtype in _INTS):
        return out
    # Few passes and one host read: min and max (NaN propagates through them, an Inf shows as one),
    # then the sum and the sum of squares of a float64 copy (a float64 dot product: as exact, and
    # cheaper than float64 reductions over float32 data or an isfinite mask).
    lo, hi = torch.aminmax(x)
    xd = x.reshape(-1).to(torch.float64)
    lo_, hi_, total, squares = torch.stack([lo.to(torch.float64), hi.to(torch.float64), xd.sum(),
                                            torch.dot(xd, xd)]).tolist()
    if math.isfinite(lo_) and math.isfinite(hi_):
        out["nan"] = out["inf"] = 0
    else:  # the rare case: count, then drop
        out["nan"], out["inf"] = int(x.isnan().sum()), int(x.isinf().sum())
        xd = xd[xd.isfinite()]
        if not xd.numel():
            return out
        lo_, hi_ = (float(v) for v in torch.aminmax(xd))
        total, squares = float(xd.sum()), float(torch.dot(xd, xd))
    out.update(min=lo_, max=hi_, mean=total / xd.numel(), norm=math.sqrt(squares))
    return out


_INTS = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)


def tensor_checksum(t: torch.Tensor) -> str:
    """A hash of the tensor's bytes (its values in row-major order): equal only if bitwise equal."""
    x = t.detach().to("cpu").contiguous().reshape(-1)
    if x.is_conj():
        x = x.resolve_conj()
    raw = x.view(torch.uint8) if x.numel() and x.dtype != torch.bool else x.to(torch.uint8)
    h = hashlib.blake2b(digest_size=16)
    h.update(str((tuple(x.shape), str(x.dtype))).encode())
    h.update(raw.numpy().tobytes())
    return h.hexdigest()


def summarise(mode: str, out) -> dict:
    """The index fields a stats or checksum capture writes for an op's outputs."""
    if mode == "stats":
        return {"stats": [tensor_stats(t) for t in _tensors(out)]}
    return {"checksums": [tensor_checksum(t) for t in _tensors(out)]}


def compare_summaries(ra: dict, rb: dict) -> tuple[str, str, str] | None:
    """(status, rule, detail) from the stats or checksums of two records, or None if they have none."""
    if "checksums" in ra and "checksums" in rb:
        same = ra["checksums"] == rb["checksums"]
        differ = [i for i, (x, y) in enumerate(zip(ra["checksums"], rb["checksums"])) if x != y]
        return ("pass", "checksum", "bitwise equal") if same else (
            "fail", "checksum", f"outputs {differ or 'count'} differ bitwise")
    if "stats" in ra and "stats" in rb:
        if len(ra["stats"]) != len(rb["stats"]):
            return "fail", "stats", f"{len(ra['stats'])} outputs != {len(rb['stats'])}"
        for i, (a, b) in enumerate(zip(ra["stats"], rb["stats"])):
            if (a.get("nan"), a.get("inf")) != (b.get("nan"), b.get("inf")):
                return "fail", "stats", (f"output {i}: NaN/Inf counts {a.get('nan')}/{a.get('inf')} "
                                         f"vs {b.get('nan')}/{b.get('inf')}")
            dtype = getattr(torch, a.get("dtype", "float32"), torch.float32)
            rtol = default_tolerance(dtype).rtol if isinstance(dtype, torch.dtype) else 1e-5
            # scale: the typical magnitude (norm / sqrt(n)), so a mean near zero is not judged relatively
            scale = (b.get("norm") or 0.0) / math.sqrt(max(b.get("numel", 1), 1))
            for key in _STATS:
                x, y = a.get(key), b.get(key)
                if x is None or y is None:
                    continue
                bound = rtol * (abs(y) + scale) * (math.sqrt(max(b.get("numel", 1), 1)) if key == "norm" else 1)
                if abs(x - y) > bound + 1e-30:
                    return "fail", "stats", f"output {i}: {key} {x:.9g} vs {y:.9g} (bound {bound:.3g})"
        return "pass", "stats", "statistics within tolerance"
    return None
