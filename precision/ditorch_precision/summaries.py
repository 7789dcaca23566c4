"""Statistics-only and checksum captures: per output tensor a few numbers instead of the tensor, so
a whole network can be captured every step without filling a disk, and their comparison."""
from __future__ import annotations

import hashlib
import math
import weakref

import torch

from . import native
from .dump import readable, tensors_in, version_of
from .metrics import default_tolerance

MODES = ("full", "stats", "checksum")
_STATS = ("min", "max", "mean", "norm")


def _tensors(tree) -> list[torch.Tensor]:
    return tensors_in(tree)


def tensor_stats(t: torch.Tensor) -> dict:
    """min, max, mean, L2 norm (float64 sums, over finite values) and NaN/Inf counts of one tensor:
    CPU tensors in one fused pass of the C++ module (``native``), others (or without it) in torch
    with a float64 copy."""
    x = readable(t).detach()
    out: dict = {"dtype": str(x.dtype).removeprefix("torch."), "numel": x.numel()}
    if not x.numel() or x.is_complex() or x.dtype == torch.bool or not (x.is_floating_point() or x.dtype in _INTS):
        return out
    fused = native.fused_stats(x)
    if fused is not None:  # one pass in the tensor's own dtype, float64 accumulators, no copy
        _, out["nan"], out["inf"], finite, lo_, hi_, total, squares = fused
        if finite:
            out.update(min=lo_, max=hi_, mean=total / finite, norm=math.sqrt(squares))
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


# Views whose output holds exactly the elements of their first argument, each once, in another
# shape or order: their statistics (min, max, sum, sum of squares, NaN/Inf counts) are the input's.
SAME_ELEMENTS = frozenset({"aten::view", "aten::_unsafe_view", "aten::_reshape_alias", "aten::t", "aten::transpose",
                           "aten::permute", "aten::detach", "aten::alias", "aten::squeeze", "aten::unsqueeze"})
# Ops with outputs that reduce their first argument: a stats capture keeps that argument's statistics too
# (``input_stats``), the magnitude of what they add up, at which those outputs' rounding is judged
# (reduction_scale). A sum that cancels to rounding noise (BERT's key-bias gradient, zero in exact
# arithmetic: about 1e-12; a layer norm's row mean near zero) differs between honest runs by far more
# than its own size. op -> (output, "sum" or "mean"), ...; the C++ observer's kReductions names the same.
REDUCTIONS: dict[str, tuple[tuple[int, str], ...]] = {
    "aten::sum": ((0, "sum"),), "aten::nansum": ((0, "sum"),), "aten::mean": ((0, "mean"),),
    "aten::native_layer_norm": ((1, "mean"),),  # (output, mean, rstd)
    "aten::native_layer_norm_backward": ((1, "sum"), (2, "sum")),  # (grad_input, grad_weight, grad_bias)
    "aten::native_group_norm": ((1, "mean"),), "aten::native_batch_norm": ((1, "mean"),),
    "aten::_native_batch_norm_legit": ((1, "mean"),),
}


class StatsReuse:
    """A stats capture computes each tensor's statistics once: a tensor seen again unchanged (a
    module's output is an op's output; same object, same version counter) and a view that holds
    exactly its input's elements (``SAME_ELEMENTS``, a third of the elements a LLaMA step's ops
    return) take the statistics already computed. Exact: the same numbers ``tensor_stats`` gives.
    ``clear`` (each step) bounds what it keeps."""

    def __init__(self) -> None:
        self._known: dict[int, tuple[weakref.ref, int, dict]] = {}  # id -> (tensor, version, stats)

    def clear(self) -> None:
        self._known.clear()

    def _get(self, t: torch.Tensor) -> dict | None:
        hit = self._known.get(id(t))
        return hit[2] if hit is not None and hit[0]() is t and hit[1] == version_of(t) else None

    def stats(self, op: str, args, out, writes: bool = False) -> dict:
        """The ``stats`` index field of an op (or module record, ``op`` its name) returning ``out``.
        ``writes``: the op wrote an argument, whose version counter moves only once the op has
        returned: its outputs' statistics are computed, and not kept."""
        tensors = _tensors(out)
        if writes:
            return {"stats": [tensor_stats(t) for t in tensors]}
        field = {"stats": self._outputs(op, args, tensors)}
        if op in REDUCTIONS and args and isinstance(args[0], torch.Tensor):
            # not reused: what it reduces may have been written without its version counter moving (a
            # received buffer), which the C++ observer tells by its storage's writes
            field["input_stats"] = tensor_stats(args[0])
        return field

    def _outputs(self, op: str, args, tensors: list[torch.Tensor]) -> list[dict]:
        source = args[0] if op in SAME_ELEMENTS and args and isinstance(args[0], torch.Tensor) else None
        found = []
        for t in tensors:
            s = self._get(t)
            if s is None and source is not None and len(tensors) == 1 and source.dtype == t.dtype \
                    and source.numel() == t.numel():
                s = self._get(source)
            if s is None:
                s = tensor_stats(t)
            # weakly: the program's tensors are freed as they would be (an id freed and reused is told
            # apart by the reference)
            if (version := version_of(t)) is not None:
                self._known[id(t)] = (weakref.ref(t), version, s)
            found.append(s)
        return found


def stats_rtol(a: dict) -> float:
    """The tolerance of one tensor's statistics: its dtype's default rtol."""
    dtype = getattr(torch, a.get("dtype", "float32"), torch.float32)
    return default_tolerance(dtype).rtol if isinstance(dtype, torch.dtype) else 1e-5


def reduction_scale(kind: str, out: dict, summed: dict) -> float:
    """The magnitude at which a reduction's result (``out``, statistics of one output) is rounded: per
    output element, what it adds up, sqrt(k) x the typical magnitude of its k terms (``summed``: its
    first argument's statistics), over k for a mean (``kind``). A float sum's rounding error is at most
    about eps x the sum of its terms' magnitudes, which that bounds (Cauchy-Schwarz), however much they
    cancel."""
    m, n = max(out.get("numel", 1), 1), summed.get("numel", 0)
    if not n or not summed.get("norm"):
        return 0.0
    k = max(n / m, 1.0)
    scale = math.sqrt(k) * summed["norm"] / math.sqrt(m)
    return scale / k if kind == "mean" else scale


# The key under which note_reduction_scales leaves a record's per-output least magnitudes (not in the index).
FLOORS = "_scale_floors"


def same_numbers(st: dict) -> tuple | None:
    return None if st.get("norm") is None else tuple(st.get(k) for k in ("dtype", "numel", *_STATS))


# A reduction's result at most this fraction of the magnitude of what it added up is rounding noise (3 of
# float32's 7 digits cancelled): an optimizer that divides by a gradient's own running size scales it up.
NOISE_FRACTION = 1e-3


def note_reduction_scales(records: list[dict]) -> set[int]:
    """Gives each reduction's result (REDUCTIONS, in a record with ``input_stats``) the magnitude of what
    it added up (reduction_scale) as the least magnitude its statistics are judged at, and so every later
    output whose statistics are the very same numbers: the same elements (a view of the sum, the gradient
    it became), whose rounding is the sum's. ``records``: one run's (the reference's), in call order;
    sets FLOORS in those it concerns. Returns the sizes (numel) of the gradients that are rounding noise
    (backward sums at most NOISE_FRACTION of what they added up)."""
    scales: dict[tuple, float] = {}
    noise: set[int] = set()
    for r in records:
        outs = r.get("stats")
        if not isinstance(outs, list) or not outs:
            continue
        summed = r.get("input_stats")
        for i, kind in REDUCTIONS.get(r.get("op"), ()) if isinstance(summed, dict) else ():
            if i >= len(outs) or not isinstance(outs[i], dict) or (key := same_numbers(outs[i])) is None:
                continue
            if (floor := reduction_scale(kind, outs[i], summed)) > 0:
                scales[key] = max(floor, scales.get(key, 0.0))
                if r.get("phase") == "backward" and \
                        outs[i]["norm"] / math.sqrt(max(outs[i].get("numel", 1), 1)) <= NOISE_FRACTION * floor:
                    noise.add(outs[i].get("numel", 0))
        if not scales:
            continue
        floors = [scales.get(same_numbers(o), 0.0) if isinstance(o, dict) else 0.0 for o in outs]
        if any(floors):
            r[FLOORS] = floors
    return noise


def _units(a: dict, b: dict, keys: tuple[str, ...], floor: float):
    """(key, A's value, B's value, unit) for each statistic both hold: the unit is the value's magnitude
    plus the typical magnitude norm/sqrt(n) (at least ``floor``), times sqrt(n) for the norm; a statistic
    is within rtol where it differs by at most rtol units."""
    root = math.sqrt(max(b.get("numel", 1), 1))
    # scale: the typical magnitude (norm / sqrt(n)), so a mean near zero is not judged relatively
    scale = max((b.get("norm") or 0.0) / root, floor)
    for key in keys:
        x, y = a.get(key), b.get(key)
        if x is not None and y is not None:
            yield key, x, y, (abs(y) + scale) * (root if key == "norm" else 1)


def stats_difference(a: dict, b: dict, rtol: float, keys: tuple[str, ...] = _STATS,
                     floor: float = 0.0) -> str | None:
    """How one tensor's statistics in run A (``a``) differ from the reference's (``b``), or None: the
    NaN/Inf counts exactly, each statistic within rtol x (its value + the typical magnitude
    norm/sqrt(n)), the norm within rtol x norm; ``keys``: the statistics compared (every one by default);
    ``floor``: a least typical magnitude (a reduction's, reduction_scale)."""
    if (a.get("nan"), a.get("inf")) != (b.get("nan"), b.get("inf")):
        return f"NaN/Inf counts {a.get('nan')}/{a.get('inf')} vs {b.get('nan')}/{b.get('inf')}"
    for key, x, y, unit in _units(a, b, keys, floor):
        if abs(x - y) > rtol * unit + 1e-30:
            return f"{key} {x:.9g} vs {y:.9g} (bound {rtol * unit:.3g})"
    return None


def stats_ratio(a: dict, b: dict, floor: float = 0.0) -> float:
    """The least rtol at which stats_difference passes two tensors' statistics (inf where their NaN/Inf
    counts differ): how far apart the runs are at this tensor, in the units the stats rule judges in."""
    if (a.get("nan"), a.get("inf")) != (b.get("nan"), b.get("inf")):
        return math.inf
    return max((abs(x - y) / unit if unit > 0 else math.inf
                for _, x, y, unit in _units(a, b, _STATS, floor) if x != y), default=0.0)


def difference_floor(a: dict, b: dict) -> float | None:
    """A lower bound of ||a - b|| (the tensors' L2 distance) from two tensors' statistics alone: the
    norms' difference, the sums' over sqrt(n) (Cauchy-Schwarz), and the extremes' (each at most the
    largest elementwise difference); None where they do not describe tensors of one size."""
    n = a.get("numel")
    if not n or n != b.get("numel") or any(not isinstance(s.get(k), (int, float)) for s in (a, b) for k in _STATS):
        return None
    return max(abs(a["norm"] - b["norm"]), abs(a["mean"] - b["mean"]) * math.sqrt(n),
               abs(a["min"] - b["min"]), abs(a["max"] - b["max"]))


def difference_estimate(a: dict, b: dict) -> float | None:
    """An estimate of ||a - b|| from two tensors' statistics alone, where the elements moved apart by
    differences of either sign (honest drift: other roundings, Adam's steps on gradients that are
    rounding noise): the sums' difference, whose square has ||a - b||^2 for its mean under random signs,
    and no less than difference_floor. Not a bound: a difference that cancels in the sum (a layer norm's
    output, whose sum is zero) shows only its floor."""
    floor = difference_floor(a, b)
    if floor is None:
        return None
    return max(floor, float(abs(a["mean"] - b["mean"]) * a["numel"]))


def outputs_in_common(shapes_a: list, shapes_b: list) -> int:
    """How many outputs two records of one module are compared on: a module may return extra outputs in one
    run (eager attention's weights, None from a fused kernel), so as far as both have them, shape for shape,
    and at least the first."""
    n = next((i for i, (x, y) in enumerate(zip(shapes_a, shapes_b)) if tuple(x) != tuple(y)),
             min(len(shapes_a), len(shapes_b)))
    return max(n, 1)


def _module_outputs_shared(ra: dict, rb: dict) -> int | None:
    """outputs_in_common of two module records, from their index lines; None for an op's (every output)."""
    if ra.get("kind") != "module":
        return None
    return outputs_in_common(*([o.get("shape") or () for o in r.get("outputs") or [] if isinstance(o, dict)]
                               for r in (ra, rb)))


def compare_summaries(ra: dict, rb: dict, least_rtol: float = 0.0) -> tuple[str, str, str] | None:
    """(status, rule, detail) from the stats or checksums of two records, or None if they have none;
    ``least_rtol``: the statistics' tolerance is at least this (a mixed-precision policy's)."""
    n = _module_outputs_shared(ra, rb)
    if "checksums" in ra and "checksums" in rb:
        xs, ys = ra["checksums"][:n], rb["checksums"][:n]
        differ = [i for i, (x, y) in enumerate(zip(xs, ys)) if x != y]
        return ("pass", "checksum", "bitwise equal") if xs == ys else (
            "fail", "checksum", f"outputs {differ or 'count'} differ bitwise")
    if "stats" in ra and "stats" in rb:
        paired = _paired_stats(ra, rb)
        if isinstance(paired, str):
            return "fail", "stats", paired
        for i, (a, b, floor) in enumerate(paired):
            if (why := stats_difference(a, b, max(stats_rtol(a), least_rtol), floor=floor)) is not None:
                return "fail", "stats", f"output {i}: {why}"
        return "pass", "stats", "statistics within tolerance"
    return None


def _paired_stats(ra: dict, rb: dict) -> list[tuple[dict, dict, float]] | str:
    """Two stats records' outputs as compared (a module record's on the outputs both have), each with the
    least typical magnitude it is judged at (FLOORS); or why they cannot be paired."""
    n = _module_outputs_shared(ra, rb)
    xs, ys = ra["stats"][:n], rb["stats"][:n]
    if len(xs) != len(ys):
        return f"{len(xs)} outputs != {len(ys)}"
    floors = rb.get(FLOORS) or ()
    return [(x, y, floors[i] if i < len(floors) else 0.0) for i, (x, y) in enumerate(zip(xs, ys))]


def _compared_stats(ra: dict, rb: dict) -> list[tuple[dict, dict, float]] | None:
    """_paired_stats of two records' outputs that both hold statistics; None where either holds none or
    their output counts differ."""
    if not isinstance(ra.get("stats"), list) or not isinstance(rb.get("stats"), list):
        return None
    paired = _paired_stats(ra, rb)
    if isinstance(paired, str):
        return None
    return [(x, y, floor) for x, y, floor in paired if isinstance(x, dict) and isinstance(y, dict)]


def summaries_apart(ra: dict, rb: dict) -> tuple[float, float] | None:
    """How far apart two stats records' outputs are (as far as compare_summaries compares them), the largest
    over the outputs of each: their stats_ratio, and their relative difference ||a - b|| / ||b|| as
    difference_estimate sees it; None where either holds no statistics or their output counts differ."""
    paired = _compared_stats(ra, rb)
    if paired is None:
        return None
    ratio = max((stats_ratio(x, y, floor) for x, y, floor in paired), default=0.0)
    estimate = max((est / y["norm"] for x, y, _ in paired
                    if y.get("norm") and (est := difference_estimate(x, y)) is not None), default=0.0)
    return ratio, estimate
