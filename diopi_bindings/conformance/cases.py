"""Generated test cases per operator: inputs in the case's dtype with edge shapes (empty, scalar,
broadcast, non-contiguous, large) and a float64 reference computed by torch on the CPU.

A case holds the operator's arguments in ABI order. Outputs are allocated from the reference's
shapes; ``inout`` tensors carry their initial values. ``reference`` receives the same arguments
with every floating tensor cast to float64 and returns the expected value of every output.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn.functional as F

from diopi_bindings.abi import DTYPE_NAMES
from diopi_bindings.schema import BY_NAME, GELU_APPROXIMATE, OpSchema

Reference = Callable[[dict[str, Any]], tuple[torch.Tensor, ...]]


@dataclass
class Case:
    op: OpSchema
    label: str
    dtype: torch.dtype
    inputs: dict[str, Any]  # tensor inputs, inout initial values and scalars, by argument name
    reference: Reference
    # Outputs whose strides are not contiguous (allocated transposed): exercises writes through strides.
    transposed_outputs: tuple[str, ...] = ()
    out_dtypes: dict[str, torch.dtype] = field(default_factory=dict)
    # How many terms each output element sums (1: elementwise); the error bound grows with it.
    reduction_length: int = 1
    # The scale an output element's accumulation error is measured against: None its own |value|
    # (a well-conditioned result), "abs" the reference on |inputs| (the sum of |terms|: products and
    # sums that may cancel), "scale" the output's largest |value| (other cancelling formulas).
    magnitude: str | None = None
    # The reference's outputs and error scales, once computed (by the runner, before it forks: autograd
    # refuses to run in a forked child of a process whose autograd threads started).
    expected: tuple | None = field(default=None, repr=False)
    magnitudes: list | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return f"{self.op.aten}[{_dtype_name(self.dtype)}] {self.label}"


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class _Gen:
    """Seeded inputs of one dtype."""

    def __init__(self, dtype: torch.dtype, seed: int) -> None:
        self.dtype = dtype
        self.g = torch.Generator().manual_seed(seed)

    def rand(self, *shape: int, lo: float = -2.0, hi: float = 2.0, layout: str = "contiguous") -> torch.Tensor:
        if layout == "transposed":  # the last two dims swapped in memory
            base = self.rand(*shape[:-2], shape[-1], shape[-2], lo=lo, hi=hi)
            return base.transpose(-1, -2)
        if layout == "strided":  # every other element of the last dim
            return self.rand(*shape[:-1], shape[-1] * 2, lo=lo, hi=hi)[..., ::2]
        if not self.dtype.is_floating_point:
            return torch.randint(int(lo), int(hi) + 1, shape, generator=self.g, dtype=self.dtype)
        x = torch.rand(shape, generator=self.g, dtype=torch.float64) * (hi - lo) + lo
        return x.to(self.dtype)

    def nonzero(self, *shape: int) -> torch.Tensor:
        magnitude = self.rand(*shape, lo=0.5, hi=2.0)
        sign = torch.where(torch.rand(shape, generator=self.g) < 0.5, -1.0, 1.0).to(self.dtype)
        return magnitude * sign

    def index(self, high: int, *shape: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
        return torch.randint(0, high, shape, generator=self.g, dtype=dtype)

    def distinct(self, *shape: int) -> torch.Tensor:
        """Distinct small integers (exact in every float dtype): no ties for max."""
        n = math.prod(shape)
        return (torch.randperm(n, generator=self.g) - n // 2).reshape(shape).to(self.dtype)


def _stat_dtype(dtype: torch.dtype) -> torch.dtype:
    """Saved statistics (rstd, logsumexp) stay float32 for half-precision inputs, as in ATen."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _elementwise_shapes(binary: bool) -> list[tuple[str, tuple, tuple, str]]:
    """(label, shape a, shape b, layout of a)."""
    return [
        ("basic", (4, 5), (4, 5), "contiguous"),
        ("scalar", (), (), "contiguous"),
        ("empty", (0, 3), (0, 3), "contiguous"),
        ("broadcast", (3, 1, 4), (5, 4), "contiguous") if binary else ("row", (1, 7), (1, 7), "contiguous"),
        ("non-contiguous", (6, 5), (6, 5), "transposed"),
        ("strided", (3, 4), (3, 4), "strided"),
        ("large", (64, 1024), (64, 1024), "contiguous"),
        ("long 1-d", (4099,), (4099,), "contiguous"),  # past any vector width, with a tail
    ]


_BIG = ("large", "long 1-d")  # sizes an operator's variants need not all repeat


def _unary_cases(op: OpSchema, g: _Gen, fn: Callable, lo: float, hi: float, scalars: dict | None = None,
                 large: bool = True) -> list[Case]:
    """``large=False``: an operator variant whose large case would only repeat the first variant's."""
    cases = []
    for label, shape, _, layout in _elementwise_shapes(False):
        if label in _BIG and not large:
            continue
        x = g.rand(*shape, lo=lo, hi=hi, layout=layout)
        cases.append(Case(op, label, g.dtype, {"self": x, **(scalars or {})}, lambda a, fn=fn: (fn(a),)))
    x = g.rand(4, 6, lo=lo, hi=hi)
    cases.append(Case(op, "non-contiguous output", g.dtype, {"self": x, **(scalars or {})},
                      lambda a, fn=fn: (fn(a),), transposed_outputs=(op.outputs[0].name,)))
    return cases


def _binary_cases(op: OpSchema, g: _Gen, fn: Callable, names: tuple[str, str], divisor: bool = False,
                  scalars: dict | None = None, large: bool = True) -> list[Case]:
    cases = []
    for label, sa, sb, layout in _elementwise_shapes(True):
        if label in _BIG and not large:
            continue
        a = g.rand(*sa, layout=layout)
        b = g.nonzero(*sb) if divisor else g.rand(*sb)
        cases.append(Case(op, label, g.dtype, {names[0]: a, names[1]: b, **(scalars or {})}, lambda d, fn=fn: (fn(d),)))
    return cases


def _elementwise(op: OpSchema, g: _Gen) -> list[Case]:
    name = op.aten
    if name in ("aten::add.Tensor", "aten::sub.Tensor"):
        sign = 1.0 if name == "aten::add.Tensor" else -1.0
        alpha = 0.5 if g.dtype.is_floating_point else 3.0  # an integer alpha for integer tensors, as torch
        return _binary_cases(op, g, lambda d, s=sign: d["self"] + s * d["alpha"] * d["other"], ("self", "other"),
                             scalars={"alpha": alpha})
    if name == "aten::mul.Tensor":
        return _binary_cases(op, g, lambda d: d["self"] * d["other"], ("self", "other"))
    if name == "aten::div.Tensor":
        return _binary_cases(op, g, lambda d: d["self"] / d["other"], ("self", "other"), divisor=True)
    unary = {
        "aten::neg": (lambda a: -a["self"], -2, 2),
        "aten::exp": (lambda a: a["self"].exp(), -3, 3),
        "aten::rsqrt": (lambda a: a["self"].rsqrt(), 0.1, 4),
        "aten::sigmoid": (lambda a: a["self"].sigmoid(), -6, 6),
        "aten::silu": (lambda a: F.silu(a["self"]), -6, 6),
        "aten::sqrt": (lambda a: a["self"].sqrt(), 0.0, 4),
        "aten::log": (lambda a: a["self"].log(), 0.05, 8),
        "aten::cos": (lambda a: a["self"].cos(), -7, 7),
        "aten::sin": (lambda a: a["self"].sin(), -7, 7),
    }
    if name in unary:
        fn, lo, hi = unary[name]
        return _unary_cases(op, g, fn, lo, hi)
    if name == "aten::reciprocal":  # away from zero, each sign
        return [c for lo, hi in ((0.25, 4.0), (-4.0, -0.25))
                for c in _relabel(_unary_cases(op, g, lambda a: a["self"].reciprocal(), lo, hi, large=lo > 0),
                                  "positive" if lo > 0 else "negative")]
    if name == "aten::addcmul":
        cases = []
        for label, sa, sb, layout in _elementwise_shapes(True):
            args = {"self": g.rand(*sa, layout=layout), "tensor1": g.rand(*sb), "tensor2": g.rand(*sb), "value": 0.25}
            cases.append(Case(op, label, g.dtype, args,
                              lambda d: (torch.addcmul(d["self"], d["tensor1"], d["tensor2"], value=d["value"]),)))
        return cases
    if name == "aten::addcdiv":
        cases = []
        for label, sa, sb, layout in _elementwise_shapes(True):
            args = {"self": g.rand(*sa, layout=layout), "tensor1": g.rand(*sb), "tensor2": g.nonzero(*sb),
                    "value": -0.25}
            cases.append(Case(op, label, g.dtype, args,
                              lambda d: (torch.addcdiv(d["self"], d["tensor1"], d["tensor2"], value=d["value"]),)))
        return cases
    if name == "aten::lerp.Scalar":
        return [c for w in (0.3, 0.9) for c in _relabel(_binary_cases(
            op, g, lambda d: torch.lerp(d["self"], d["end"], d["weight"]), ("self", "end"), scalars={"weight": w},
            large=w == 0.3), f"weight={w:g}")]
    if name == "aten::relu":
        return _unary_cases(op, g, lambda a: torch.relu(a["self"]), -2, 2)
    if name == "aten::threshold_backward":
        return [c for t in (0.0, 0.5) for c in _relabel(_binary_cases(
            op, g, lambda d: torch.ops.aten.threshold_backward(d["grad_output"], d["self"], d["threshold"]),
            ("grad_output", "self"), scalars={"threshold": t}, large=t == 0.0), f"threshold={t:g}")]
    if name == "aten::gelu":
        return [c for approx, code in GELU_APPROXIMATE.items()
                for c in _relabel(_unary_cases(op, g, lambda a, ap=approx: F.gelu(a["self"], approximate=ap), -4, 4,
                                               {"approximate": code}, large=code == 0), f"approximate={approx}")]
    if name == "aten::pow.Tensor_Scalar":
        return [c for e in (2.0, 0.5, -1.5, 3.0)
                for c in _relabel(_unary_cases(op, g, lambda a: a["self"].pow(a["exponent"]), 0.2, 3,
                                               {"exponent": e}, large=e == 2.0), f"exponent={e:g}")]
    backward = {
        "aten::silu_backward": lambda a: torch.ops.aten.silu_backward(a["grad_output"], a["self"]),
        "aten::sigmoid_backward": lambda a: torch.ops.aten.sigmoid_backward(a["grad_output"], a["output"]),
    }
    if name in backward:
        second = "output" if name == "aten::sigmoid_backward" else "self"
        return _binary_cases(op, g, backward[name], ("grad_output", second))
    if name == "aten::gelu_backward":
        return [c for approx, code in GELU_APPROXIMATE.items()
                for c in _relabel(_binary_cases(
                    op, g,
                    lambda a, ap=approx: torch.ops.aten.gelu_backward(a["grad_output"], a["self"], approximate=ap),
                    ("grad_output", "self"), scalars={"approximate": code}, large=code == 0), f"approximate={approx}")]
    raise KeyError(name)


def _relabel(cases: list[Case], prefix: str) -> list[Case]:
    for c in cases:
        c.label = f"{prefix} {c.label}"
    return cases


def _matmul(op: OpSchema, g: _Gen) -> list[Case]:
    if op.aten == "aten::mm":
        shapes = [("basic", (5, 7), (7, 3), "contiguous"), ("empty k", (4, 0), (0, 3), "contiguous"),
                  ("non-contiguous", (6, 8), (8, 4), "transposed"), ("large", (128, 256), (256, 96), "contiguous"),
                  ("long k", (48, 1100), (1100, 48), "contiguous")]
        return [Case(op, label, g.dtype, {"self": g.rand(*a, layout=lay), "mat2": g.rand(*b, layout=lay)},
                     lambda d: (d["self"] @ d["mat2"],)) for label, a, b, lay in shapes]
    if op.aten == "aten::addmm":
        cases = []
        for label, s, a, b, beta, alpha, lay in [
                ("bias row", (3,), (5, 7), (7, 3), 1.0, 1.0, "contiguous"),
                ("full self, beta and alpha", (4, 6), (4, 5), (5, 6), 0.5, 2.0, "contiguous"),
                ("beta 0 ignores self (NaN)", (4, 3), (4, 5), (5, 3), 0.0, 1.0, "contiguous"),
                ("non-contiguous", (4,), (6, 8), (8, 4), 1.0, 1.0, "transposed"),
                ("empty k", (3,), (4, 0), (0, 3), 1.0, 1.0, "contiguous"),
                ("large", (96,), (128, 256), (256, 96), 1.0, 1.0, "contiguous"),
                ("long k", (48,), (48, 1100), (1100, 48), 1.0, 1.0, "contiguous")]:
            bias = g.rand(*s)
            if beta == 0.0:
                bias = torch.full(s, float("nan"), dtype=g.dtype)
            args = {"self": bias, "mat1": g.rand(*a, layout=lay), "mat2": g.rand(*b, layout=lay), "beta": beta,
                    "alpha": alpha}
            cases.append(Case(op, label, g.dtype, args, lambda d: (torch.addmm(
                d["self"], d["mat1"], d["mat2"], beta=d["beta"], alpha=d["alpha"]),)))
        return cases
    if op.aten == "aten::bmm":
        shapes = [("basic", (3, 5, 7), (3, 7, 2), "contiguous"), ("empty batch", (0, 2, 3), (0, 3, 4), "contiguous"),
                  ("non-contiguous", (2, 6, 8), (2, 8, 4), "transposed"),
                  ("long k", (2, 32, 1100), (2, 1100, 36), "contiguous")]
        return [Case(op, label, g.dtype, {"self": g.rand(*a, layout=lay), "mat2": g.rand(*b, layout=lay)},
                     lambda d: (torch.bmm(d["self"], d["mat2"]),)) for label, a, b, lay in shapes]
    cases = []
    for label, x, w, bias, lay in [("bias", (4, 6), (5, 6), True, "contiguous"),
                                   ("no bias", (2, 3, 6), (5, 6), False, "contiguous"),
                                   ("non-contiguous", (7, 8), (3, 8), True, "transposed"),
                                   ("large", (256, 512), (384, 512), True, "contiguous"),
                                   ("long k", (48, 1100), (48, 1100), True, "contiguous")]:
        args = {"input": g.rand(*x, layout=lay), "weight": g.rand(*w, layout=lay),
                "bias": g.rand(w[0]) if bias else None}
        cases.append(Case(op, label, g.dtype, args, lambda d: (F.linear(d["input"], d["weight"], d["bias"]),)))
    return cases


def _softmax(op: OpSchema, g: _Gen) -> list[Case]:
    log = "log_softmax" in op.aten
    shapes = [("last dim", (4, 9), -1, "contiguous"), ("dim 0", (5, 3), 0, "contiguous"),
              ("middle dim", (2, 6, 3), 1, "contiguous"), ("non-contiguous", (6, 7), 1, "transposed"),
              ("empty", (0, 5), -1, "contiguous"), ("large", (64, 2048), -1, "contiguous"),
              ("long rows", (16, 2048), -1, "contiguous")]
    cases = []
    for label, shape, dim, lay in shapes:
        x = g.rand(*shape, lo=-8, hi=8, layout=lay)
        if "backward" in op.aten:
            y = (torch.log_softmax if log else torch.softmax)(x.double(), dim).to(g.dtype)
            fn = torch.ops.aten._log_softmax_backward_data if log else torch.ops.aten._softmax_backward_data
            cases.append(Case(op, label, g.dtype, {"grad_output": g.rand(*shape), "output": y, "dim": dim},
                              lambda d, fn=fn: (fn(d["grad_output"], d["output"], d["dim"], torch.float64),)))
        else:
            fn = torch.ops.aten._log_softmax if log else torch.ops.aten._softmax
            cases.append(Case(op, label, g.dtype, {"self": x, "dim": dim, "half_to_float": False},
                              lambda d, fn=fn: (fn(d["self"], d["dim"], False),)))
    return cases


def _safe_softmax(op: OpSchema, g: _Gen) -> list[Case]:
    cases = _softmax(BY_NAME["aten::_softmax"], g)
    for c in cases:
        c.op, c.inputs = op, {"self": c.inputs["self"], "dim": c.inputs["dim"]}
    masked = g.rand(4, 6, lo=-8, hi=8)
    masked[1] = float("-inf")  # a fully masked row: zeros, not NaN
    masked[2, :3] = float("-inf")
    cases.append(Case(op, "masked rows", g.dtype, {"self": masked, "dim": -1}, lambda d: ()))
    for c in cases:
        c.reference = lambda d: (torch.ops.aten._safe_softmax(d["self"], d["dim"]),)
    return cases


def _slice_backward(op: OpSchema, g: _Gen) -> list[Case]:
    cases = []
    for label, sizes, dim, start, end, step, lay in [
            ("last dim", (4, 8), 1, 2, 8, 2, "contiguous"), ("dim 0", (6, 3), 0, 1, 5, 1, "contiguous"),
            ("negative dim, end past the size", (2, 5, 4), -2, 0, 100, 3, "contiguous"),
            ("non-contiguous", (5, 6), 1, 1, 4, 1, "transposed"), ("empty slice", (3, 4), 1, 2, 2, 1, "contiguous"),
            ("large", (64, 2048), 1, 0, 2048, 2, "contiguous")]:
        grad_shape = list(sizes)
        grad_shape[dim] = len(range(*slice(start, end, step).indices(sizes[dim])))
        args = {"grad_output": g.rand(*grad_shape, layout=lay), "input_sizes": list(sizes), "dim": dim,
                "start": start, "end": end, "step": step}
        cases.append(Case(op, label, g.dtype, args, lambda d: (torch.ops.aten.slice_backward(
            d["grad_output"], d["input_sizes"], d["dim"], d["start"], d["end"], d["step"]),)))
    return cases


_RMS_EPS = 1e-5


def _rms_norm(op: OpSchema, g: _Gen) -> list[Case]:
    cases = []
    for label, shape, norm, weight, lay in [("weight", (4, 16), (16,), True, "contiguous"),
                                            ("no weight", (2, 3, 8), (8,), False, "contiguous"),
                                            ("two dims", (2, 3, 8), (3, 8), True, "contiguous"),
                                            ("non-contiguous", (6, 10), (10,), True, "transposed"),
                                            ("long rows", (4, 2048), (2048,), True, "contiguous")]:
        x = g.rand(*shape, layout=lay)
        w = g.rand(*norm, lo=0.5, hi=1.5) if weight else None
        if op.aten == "aten::_fused_rms_norm":
            args = {"input": x, "weight": w, "normalized_shape": list(norm), "eps": _RMS_EPS}
            cases.append(Case(op, label, g.dtype, args,
                              lambda d: torch.ops.aten._fused_rms_norm(
                                  d["input"], d["normalized_shape"], d["weight"], d["eps"]),
                              out_dtypes={"rstd": _stat_dtype(g.dtype)}))
        else:
            _, rstd = torch.ops.aten._fused_rms_norm(x.double(), list(norm), None, _RMS_EPS)
            args = {"grad_out": g.rand(*shape), "input": x, "rstd": rstd.to(_stat_dtype(g.dtype)), "weight": w,
                    "normalized_shape": list(norm)}
            cases.append(Case(op, label, g.dtype, args, _rms_backward))
    return cases


def _rms_backward(d: dict) -> tuple:
    """Autograd through RMSNorm written out in float64 (torch has no CPU kernel for the backward)."""
    x = d["input"].detach().clone().requires_grad_(True)
    dims = tuple(range(-len(d["normalized_shape"]), 0))
    w = None if d["weight"] is None else d["weight"].detach().clone().requires_grad_(True)
    y = x * torch.rsqrt(x.pow(2).mean(dims, keepdim=True) + _RMS_EPS)
    y = y if w is None else y * w
    grads = torch.autograd.grad(y, (x,) if w is None else (x, w), d["grad_out"])
    return grads[0], grads[1] if w is not None else None  # no weight: no grad_weight wanted


def _rotary(op: OpSchema, g: _Gen) -> list[Case]:
    def rope(seq: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
        inv = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
        freqs = torch.outer(torch.arange(seq, dtype=torch.float64), inv)
        emb = torch.cat([freqs, freqs], -1)  # LLaMA's layout: both halves equal
        return emb.cos().to(g.dtype), emb.sin().to(g.dtype)

    def reference(d: dict) -> tuple:
        x, c, s = d["x"], d["cos"], d["sin"]
        half = x.shape[-1] // 2
        rot = torch.cat([-x[..., half:], x[..., :half]], -1)
        return (x * c - rot * s if d["conj"] else x * c + rot * s,)

    cases = []
    for label, shape, lay, conj in [("forward", (2, 3, 5, 8), "contiguous", False),
                                    ("backward", (2, 3, 5, 8), "contiguous", True),
                                    ("non-contiguous", (2, 4, 6), "transposed", False),
                                    ("large", (2, 8, 128, 64), "contiguous", False)]:
        x = g.rand(*shape, layout=lay)
        c, s = rope(x.shape[-2], x.shape[-1])
        cases.append(Case(op, label, g.dtype, {"x": x, "cos": c, "sin": s, "conj": conj}, reference))
    return cases


def _attention(op: OpSchema, g: _Gen) -> list[Case]:
    def scores(d: dict) -> torch.Tensor:
        s = d["query"] @ d["key"].transpose(-1, -2) * d["scale"]
        if d["is_causal"]:
            S, L = s.shape[-2:]
            s = s.masked_fill(torch.ones(S, L, dtype=torch.bool).triu(1), float("-inf"))
        return s

    def forward(d: dict) -> tuple:
        s = scores(d)
        return torch.softmax(s, -1) @ d["value"], s.logsumexp(-1)

    def backward(d: dict) -> tuple:
        """The gradients given the saved ``out`` and ``logsumexp`` (as rounded to the case's dtype):
        P = exp(scores - logsumexp), dS = P * (dO V^T - rowsum(dO * out))."""
        p = (scores(d) - d["logsumexp"].unsqueeze(-1)).exp()
        g = d["grad_out"]
        ds = p * (g @ d["value"].transpose(-1, -2) - (g * d["out"]).sum(-1, keepdim=True)) * d["scale"]
        return ds @ d["key"], ds.transpose(-1, -2) @ d["query"], p.transpose(-1, -2) @ g

    cases = []
    for label, (B, H, S, L, D), causal in [("causal", (2, 2, 5, 5, 8), True), ("full", (1, 3, 4, 6, 8), False),
                                           ("causal rectangular", (1, 2, 6, 4, 4), True),
                                           ("large", (1, 4, 128, 128, 32), True),
                                           ("long keys", (1, 1, 8, 1100, 16), False)]:
        q, k, v = g.rand(B, H, S, D), g.rand(B, H, L, D), g.rand(B, H, L, D)
        scale = 1.0 / math.sqrt(D)
        if op.aten.endswith("_backward"):
            with torch.no_grad():
                out, lse = forward({"query": q.double(), "key": k.double(), "value": v.double(), "scale": scale,
                                    "is_causal": causal})
            args = {"grad_out": g.rand(B, H, S, D), "query": q, "key": k, "value": v, "out": out.to(g.dtype),
                    "logsumexp": lse.to(_stat_dtype(g.dtype)), "is_causal": causal, "scale": scale}
            cases.append(Case(op, label, g.dtype, args, backward))
        else:
            args = {"query": q, "key": k, "value": v, "is_causal": causal, "scale": scale}
            cases.append(Case(op, label, g.dtype, args, forward, out_dtypes={"logsumexp": _stat_dtype(g.dtype)}))
    return cases


def _embedding(op: OpSchema, g: _Gen) -> list[Case]:
    cases = []
    for label, (V, E), idx_shape, idx_dtype, pad in [("int64", (10, 4), (3, 5), torch.int64, -1),
                                                     ("int32", (7, 3), (6,), torch.int32, -1),
                                                     ("padding", (6, 4), (2, 8), torch.int64, 2),
                                                     ("empty", (5, 3), (0,), torch.int64, -1),
                                                     ("large", (1000, 64), (8, 128), torch.int64, -1),
                                                     ("long", (8, 4), (1200,), torch.int64, -1)]:
        idx = g.index(V, *idx_shape, dtype=idx_dtype)
        if op.aten == "aten::embedding":
            args = {"weight": g.rand(V, E), "indices": idx, "padding_idx": pad}
            cases.append(Case(op, label, g.dtype, args, lambda d: (F.embedding(d["indices"], d["weight"]),)))
        else:
            for scale in (False, True):
                args = {"grad_output": g.rand(*idx_shape, E), "indices": idx, "padding_idx": pad,
                        "scale_grad_by_freq": scale, "_num_weights": V}
                cases.append(Case(op, f"{label} scale_grad_by_freq={scale}", g.dtype, args, lambda d: (
                    torch.ops.aten.embedding_dense_backward(d["grad_output"], d["indices"], d["_num_weights"],
                                                            d["padding_idx"], d["scale_grad_by_freq"]),)))
    return cases


def _nll(op: OpSchema, g: _Gen) -> list[Case]:
    cases = []
    for reduction, rname in ((0, "none"), (1, "mean"), (2, "sum")):
        for label, N, C, weighted, ignore in [("basic", 6, 5, False, -100), ("weighted", 4, 7, True, -100),
                                              ("ignore_index", 8, 4, False, 1), ("large", 256, 512, True, -100),
                                              ("long", 1200, 6, True, -100)]:
            x = torch.log_softmax(g.rand(N, C).double(), -1).to(g.dtype)
            t = g.index(C, N)
            w = g.rand(C, lo=0.5, hi=2.0) if weighted else None
            if op.aten == "aten::nll_loss_forward":
                args = {"self": x, "target": t, "weight": w, "reduction": reduction, "ignore_index": ignore}
                cases.append(Case(op, f"{rname} {label}", g.dtype, args, lambda d: torch.ops.aten.nll_loss_forward(
                    d["self"], d["target"], d["weight"], d["reduction"], d["ignore_index"])))
            else:
                _, total = torch.ops.aten.nll_loss_forward(
                    x.double(), t, None if w is None else w.double(), reduction, ignore)
                grad = g.rand(N) if reduction == 0 else g.rand()
                args = {"grad_output": grad, "self": x, "target": t, "weight": w, "total_weight": total.to(g.dtype),
                        "reduction": reduction, "ignore_index": ignore}
                cases.append(Case(op, f"{rname} {label}", g.dtype, args, lambda d: (torch.ops.aten.nll_loss_backward(
                    d["grad_output"], d["self"], d["target"], d["weight"], d["reduction"], d["ignore_index"],
                    d["total_weight"]),)))
    return cases


def _reductions(op: OpSchema, g: _Gen) -> list[Case]:
    shapes = [("all dims", (4, 5), [], False, "contiguous"), ("dim 1 keepdim", (3, 4, 5), [1], True, "contiguous"),
              ("dims 0,2", (3, 4, 5), [0, -1], False, "contiguous"),
              ("non-contiguous", (6, 7), [0], False, "transposed"),
              ("scalar", (), [], False, "contiguous"), ("empty", (0, 4), [0], False, "contiguous"),
              ("large", (256, 1024), [1], False, "contiguous"), ("long", (1024, 1100), [1], False, "contiguous")]
    cases = []
    if op.aten == "aten::max.dim":
        for label, shape, dim, keep in [("dim 1", (4, 6), 1, False), ("dim 0 keepdim", (5, 3), 0, True),
                                        ("last dim 3d", (2, 3, 7), -1, False), ("scalar", (), 0, False)]:
            x = g.distinct(*shape)
            cases.append(Case(op, label, g.dtype, {"self": x, "dim": dim, "keepdim": keep},
                              lambda d: tuple(torch.max(d["self"], d["dim"], d["keepdim"])),
                              out_dtypes={"indices": torch.int64}))
        return cases
    for label, shape, dims, keep, lay in shapes:
        x = g.rand(*shape, layout=lay)
        if op.aten == "aten::sum.dim_IntList":
            cases.append(Case(op, label, g.dtype, {"self": x, "dim": dims, "keepdim": keep},
                              lambda d: (torch.sum(d["self"], d["dim"], d["keepdim"]),)))
        elif op.aten == "aten::mean.dim":
            if label == "empty":
                continue  # a mean over nothing is NaN, and torch refuses an empty mean of some dims
            cases.append(Case(op, label, g.dtype, {"self": x, "dim": dims, "keepdim": keep},
                              lambda d: (torch.mean(d["self"], d["dim"], d["keepdim"]),)))
        else:
            for ord_ in (2.0, 1.0, float("inf"), 3.0):
                if (label == "large" and ord_ != 2.0) or (label == "empty" and math.isinf(ord_)):
                    continue  # the inf norm of nothing has no value
                args = {"self": x, "ord": ord_, "dim": dims, "keepdim": keep}
                cases.append(Case(op, f"ord={ord_:g} {label}", g.dtype, args,
                                  lambda d: (torch.linalg.vector_norm(
                                      d["self"], d["ord"], d["dim"] or None, d["keepdim"]),)))
    return cases


_OTHER_DTYPE = {torch.float32: torch.float64, torch.float64: torch.float32, torch.float16: torch.float32,
                torch.bfloat16: torch.float32, torch.int64: torch.int32, torch.int32: torch.int64}


def _data_movement(op: OpSchema, g: _Gen) -> list[Case]:
    lo, hi = (-100, 100) if not g.dtype.is_floating_point else (-2, 2)
    if op.aten == "aten::_to_copy":
        cases = []
        for label, shape, lay in [("basic", (4, 5), "contiguous"), ("non-contiguous", (5, 6), "transposed"),
                                  ("empty", (0,), "contiguous")]:
            target = _OTHER_DTYPE[g.dtype]
            args = {"self": g.rand(*shape, lo=lo, hi=hi, layout=lay)}
            cases.append(Case(op, f"to {_dtype_name(target)} {label}", g.dtype, args,
                              lambda d: (d["self"],), out_dtypes={"out": target}))
        return cases
    if op.aten == "aten::clone":
        return [Case(op, "transposed input", g.dtype, {"self": g.rand(4, 7, lo=lo, hi=hi, layout="transposed")},
                     lambda d: (d["self"],)),
                Case(op, "transposed output", g.dtype, {"self": g.rand(3, 5, lo=lo, hi=hi)}, lambda d: (d["self"],),
                     transposed_outputs=("out",)),
                Case(op, "scalar", g.dtype, {"self": g.rand(lo=lo, hi=hi)}, lambda d: (d["self"],))]
    if op.aten == "aten::copy_":
        return [Case(op, "broadcast", g.dtype, {"self": g.rand(4, 5, lo=lo, hi=hi), "src": g.rand(5, lo=lo, hi=hi)},
                     lambda d: (d["src"].expand(4, 5),)),
                Case(op, "into non-contiguous", g.dtype,
                     {"self": g.rand(5, 4, lo=lo, hi=hi).t(), "src": g.rand(4, 5, lo=lo, hi=hi)},
                     lambda d: (d["src"],))]
    value = 1.5 if g.dtype.is_floating_point else 7.0
    return [Case(op, "basic", g.dtype, {"self": g.rand(3, 4, lo=lo, hi=hi), "value": value},
                 lambda d: (torch.full_like(d["self"], d["value"]),)),
            Case(op, "non-contiguous", g.dtype, {"self": g.rand(6, 4, lo=lo, hi=hi)[:, ::2], "value": value},
                 lambda d: (torch.full_like(d["self"], d["value"]),))]


def _selection(op: OpSchema, g: _Gen) -> list[Case]:
    """Joining, masking and choosing (what the rotary code and the attention's causal mask need), and a
    number raised to tensor powers."""
    lo, hi = (-100, 100) if not g.dtype.is_floating_point else (-2, 2)
    if op.aten == "aten::pow.Scalar":
        # 10000 ** [0, 1): the rotary frequencies; 0.5 ** [-3, 3]: both signs (finite in float16)
        return [Case(op, f"{base:g} ** {label}", g.dtype,
                     {"exponent": g.rand(*shape, lo=e_lo, hi=e_hi, layout=lay), "self": base},
                     lambda d: (torch.pow(d["self"], d["exponent"]),))
                for base, e_lo, e_hi in ((10000.0, 0.0, 1.0), (0.5, -3.0, 3.0)) for label, shape, lay in
                [("basic", (4, 5), "contiguous"), ("scalar", (), "contiguous"), ("empty", (0, 3), "contiguous"),
                 ("non-contiguous", (6, 5), "transposed")]]
    if op.aten == "aten::cat":
        layouts = [("two, last dim", [(4, 3), (4, 5)], -1, "contiguous"),
                   ("three, dim 0", [(2, 3, 4), (1, 3, 4), (3, 3, 4)], 0, "contiguous"),
                   ("non-contiguous, dim 1", [(5, 2), (5, 4)], 1, "transposed"),
                   ("one tensor", [(3, 4)], 0, "contiguous"),
                   ("an empty part", [(2, 4), (0, 4), (3, 4)], 0, "contiguous"),
                   ("legacy empty (0,)", [(3, 4), (0,)], 1, "contiguous"),
                   ("large", [(64, 512), (64, 512)], 1, "contiguous")]
        return [Case(op, label, g.dtype,
                     {"tensors": [g.rand(*s, lo=lo, hi=hi, layout=lay if len(s) > 1 else "contiguous")
                                  for s in shapes], "dim": dim},
                     lambda d: (torch.cat(d["tensors"], d["dim"]),))
                for label, shapes, dim, lay in layouts]
    if op.aten == "aten::tril":
        def values(*shape: int, layout: str = "contiguous") -> torch.Tensor:
            if g.dtype is torch.bool:
                return g.index(2, *shape).bool() if layout == "contiguous" else g.index(2, *shape).bool().mT
            return g.rand(*shape, lo=lo, hi=hi, layout=layout)
        return [Case(op, f"{label} diagonal={k}", g.dtype, {"self": x, "diagonal": k},
                     lambda d: (torch.tril(d["self"], d["diagonal"]),))
                for label, x in [("square", values(5, 5)), ("wide batched", values(2, 3, 6)),
                                 ("non-contiguous", values(4, 6, layout="transposed")), ("empty", values(0, 3))]
                for k in (0, -1, 2)]
    cases = []
    for label, sc, sa, sb, lay in [("basic", (4, 5), (4, 5), (4, 5), "contiguous"),
                                   ("broadcast (causal mask)", (1, 1, 5, 5), (2, 3, 5, 5), (), "contiguous"),
                                   ("non-contiguous", (6, 5), (6, 5), (6, 5), "transposed"),
                                   ("empty", (0, 3), (0, 3), (0, 3), "contiguous"),
                                   ("large", (64, 1024), (64, 1024), (64, 1024), "contiguous")]:
        cond = g.index(2, *sc).bool()
        args = {"condition": cond, "self": g.rand(*sa, lo=lo, hi=hi, layout=lay), "other": g.rand(*sb, lo=lo, hi=hi)}
        cases.append(Case(op, label, g.dtype, args, lambda d: (torch.where(d["condition"], d["self"], d["other"]),)))
    return cases


def _compare(op: OpSchema, g: _Gen) -> list[Case]:
    """ge/lt with a number: small integers in every dtype, so that ties (>= vs >) occur."""
    fn = {"aten::ge.Scalar": torch.ge, "aten::lt.Scalar": torch.lt}[op.aten]
    cases = []
    for label, shape, _, layout in _elementwise_shapes(False):
        x = g.rand(*shape, lo=-3, hi=3, layout=layout)
        x = x.round() if x.is_floating_point() else x
        for other in (0.0, 2.0, -1.5):
            if label in _BIG and other != 0.0:
                continue
            cases.append(Case(op, f"{label} other={other}", g.dtype, {"self": x, "other": other},
                              lambda d, fn=fn: (fn(d["self"], d["other"]),)))
    return cases


def _gather(op: OpSchema, g: _Gen) -> list[Case]:
    layouts = [("basic, dim 1", (4, 5), 1, (4, 3), "contiguous"), ("dim 0", (4, 5), 0, (2, 5), "contiguous"),
               ("3-d, dim -1", (2, 3, 6), -1, (2, 3, 4), "contiguous"), ("scalar", (), 0, (), "contiguous"),
               ("empty index", (4, 5), 1, (4, 0), "contiguous"), ("smaller index", (5, 6), 1, (3, 2), "contiguous"),
               ("non-contiguous self", (6, 5), 0, (3, 5), "transposed"),
               ("large", (64, 1024), 1, (64, 512), "contiguous")]
    cases = []
    for label, shape, dim, idx_shape, layout in layouts:
        x = g.rand(*shape, layout=layout)
        size = shape[dim] if shape else 1
        cases.append(Case(op, label, g.dtype, {"self": x, "index": g.index(size, *idx_shape), "dim": dim},
                          lambda d: (torch.gather(d["self"], d["dim"], d["index"]),)))
    return cases


def _indexing(op: OpSchema, g: _Gen) -> list[Case]:
    """Lists of optional index tensors. Positions are distinct (permutations) so that index_put without
    accumulate has one answer; "repeated positions" runs only with accumulate."""
    def perm(high: int, *shape: int) -> torch.Tensor:
        return torch.randperm(high, generator=g.g)[:math.prod(shape)].reshape(shape)

    rows = torch.arange(6)
    layouts = [("rows and targets", (6, 10), "contiguous", lambda: [rows, g.index(10, 6)]),
               ("slice then index", (4, 5), "contiguous", lambda: [None, perm(5, 3)]),
               ("broadcast indices", (4, 5), "contiguous", lambda: [perm(4, 3, 1), perm(5, 1, 2)]),
               ("non-adjacent: indices' shape leads", (3, 4, 5), "contiguous", lambda: [perm(3, 2), None, perm(5, 2)]),
               ("adjacent inside", (3, 4, 5, 2), "contiguous", lambda: [None, perm(4, 3), perm(5, 3)]),
               ("2-d index", (4, 5, 6), "contiguous", lambda: [None, perm(5, 2, 2)]),
               ("negative int32", (5, 4), "contiguous", lambda: [(perm(5, 3) - 5).to(torch.int32)]),
               ("empty index", (4, 5), "contiguous", lambda: [perm(4, 0)]),
               ("scalar index", (4, 5), "contiguous", lambda: [torch.tensor(2)]),
               ("non-contiguous self", (6, 5), "transposed", lambda: [perm(6, 4)]),
               ("large", (512, 256), "contiguous", lambda: [torch.arange(512), g.index(256, 512)])]
    cases = []
    for label, shape, layout, make in layouts:
        x, indices = g.rand(*shape, layout=layout), make()
        if op.aten == "aten::index.Tensor":
            cases.append(Case(op, label, g.dtype, {"self": x, "indices": indices},
                              lambda d: (torch.ops.aten.index.Tensor(d["self"], d["indices"]),)))
            continue
        values = g.rand(*torch.ops.aten.index.Tensor(x, indices).shape)
        for accumulate in (False, True):
            cases.append(Case(op, f"{label}{', accumulate' if accumulate else ''}", g.dtype,
                              {"self": x, "indices": indices, "values": values, "accumulate": accumulate},
                              lambda d: (torch.ops.aten.index_put(d["self"], d["indices"], d["values"],
                                                                  d["accumulate"]),)))
    if op.aten == "aten::index_put":
        x = g.rand(4, 5)
        cases += [Case(op, "long repeated positions, accumulate", g.dtype,
                       {"self": x, "indices": [g.index(4, 1200), g.index(5, 1200)], "values": g.rand(1200),
                        "accumulate": True},
                       lambda d: (torch.ops.aten.index_put(d["self"], d["indices"], d["values"], True),)),
                  Case(op, "repeated positions, accumulate", g.dtype,
                       {"self": x, "indices": [g.index(4, 12), g.index(5, 12)], "values": g.rand(12),
                        "accumulate": True},
                       lambda d: (torch.ops.aten.index_put(d["self"], d["indices"], d["values"], True),)),
                  Case(op, "values broadcast", g.dtype,
                       {"self": x, "indices": [perm(4, 2)], "values": g.rand(5), "accumulate": False},
                       lambda d: (torch.ops.aten.index_put(d["self"], d["indices"], d["values"], False),))]
    return cases


def _arange(op: OpSchema, g: _Gen) -> list[Case]:
    ranges = [("basic", 0.0, 10.0, 1.0), ("fractional step", 0.0, 2.0, 0.5), ("negative step", 5.0, -3.0, -2.0),
              ("empty", 3.0, 3.0, 1.0), ("one element", -1.0, 0.0, 4.0)]
    if g.dtype.is_floating_point:  # below float16's largest finite value
        ranges.append(("large", 0.0, 60000.0, 0.25))
    else:
        ranges = [r for r in ranges if r[0] != "fractional step"] + [("large", 0.0, 200000.0, 1.0)]
    return [Case(op, label, g.dtype, {"start": start, "end": end, "step": step},
                 lambda d: (torch.arange(d["start"], d["end"], d["step"], dtype=torch.float64),))
            for label, start, end, step in ranges]


def _clamp(op: OpSchema, g: _Gen) -> list[Case]:
    inf = math.inf
    cases = []
    for label, shape, _, layout in _elementwise_shapes(False):
        x = g.rand(*shape, lo=-5, hi=5, layout=layout)
        for lo, hi in ((-1.0, 2.0), (0.0, inf), (-inf, 1.5), (3.0, 1.0)):  # min > max: everything is max
            if label in _BIG and (lo, hi) != (-1.0, 2.0):
                continue
            cases.append(Case(op, f"{label} [{lo}, {hi}]", g.dtype, {"self": x, "min": lo, "max": hi},
                              lambda d: (torch.clamp(d["self"], None if d["min"] == -inf else d["min"],
                                                     None if d["max"] == inf else d["max"]),)))
    if g.dtype.is_floating_point:
        x = torch.tensor([float("nan"), -7.0, 0.5, 9.0], dtype=g.dtype)
        cases.append(Case(op, "NaN stays NaN", g.dtype, {"self": x, "min": -1.0, "max": 1.0},
                          lambda d: (torch.clamp(d["self"], d["min"], d["max"]),)))
    return cases


def _bitwise(op: OpSchema, g: _Gen) -> list[Case]:
    def values(*shape: int, layout: str = "contiguous") -> torch.Tensor:
        if layout == "transposed":
            return values(*shape[:-2], shape[-1], shape[-2]).transpose(-1, -2)
        if layout == "strided":
            return values(*shape[:-1], shape[-1] * 2)[..., ::2]
        return g.index(2, *shape).bool() if g.dtype is torch.bool else g.rand(*shape, lo=-50, hi=50)

    return [Case(op, label, g.dtype, {"self": values(*sa, layout=layout), "other": values(*sb)},
                 lambda d: (torch.bitwise_and(d["self"], d["other"]),))
            for label, sa, sb, layout in _elementwise_shapes(True)]


def _adamw(op: OpSchema, g: _Gen) -> list[Case]:
    def reference(d: dict) -> tuple:
        p = d["param"].clone().requires_grad_(True)
        opt = torch.optim.AdamW([p], lr=d["lr"], betas=(d["beta1"], d["beta2"]), eps=d["eps"],
                                weight_decay=d["weight_decay"], maximize=d["maximize"], foreach=False)
        p.grad = d["grad"].clone()
        opt.state[p] = {"step": torch.tensor(float(d["step"] - 1)), "exp_avg": d["exp_avg"].clone(),
                        "exp_avg_sq": d["exp_avg_sq"].clone()}
        opt.step()
        return p.detach(), opt.state[p]["exp_avg"], opt.state[p]["exp_avg_sq"]

    cases = []
    for label, shape, step, maximize in [("first step", (4, 5), 1, False), ("step 10", (7,), 10, False),
                                         ("maximize", (3, 3), 3, True), ("empty", (0, 4), 2, False),
                                         ("large", (64, 1024), 5, False)]:
        args = {"param": g.rand(*shape), "exp_avg": g.rand(*shape, lo=-0.1, hi=0.1),
                "exp_avg_sq": g.rand(*shape, lo=0.0, hi=0.01), "grad": g.rand(*shape), "lr": 1e-2, "beta1": 0.9,
                "beta2": 0.999, "weight_decay": 0.1, "eps": 1e-8, "step": step, "maximize": maximize}
        cases.append(Case(op, label, g.dtype, args, reference))
    return cases


def _nonzero(op: OpSchema, g: _Gen) -> list[Case]:
    """Data-dependent result sizes: some, none and all elements nonzero, scalars, empty and strided inputs."""
    def values(*shape: int, zeros: float = 0.5, layout: str = "contiguous") -> torch.Tensor:
        if layout == "transposed":
            return values(*shape[:-2], shape[-1], shape[-2], zeros=zeros).transpose(-1, -2)
        if layout == "strided":
            return values(*shape[:-1], shape[-1] * 2, zeros=zeros)[..., ::2]
        keep = torch.rand(shape, generator=g.g) >= zeros
        if g.dtype is torch.bool:
            return keep
        return torch.where(keep, g.nonzero(*shape) * 3, torch.zeros((), dtype=g.dtype)).to(g.dtype)

    layouts = [("basic", (4, 5), 0.5, "contiguous"), ("1-d", (17,), 0.5, "contiguous"),
               ("all nonzero (an all-true mask)", (3, 4), 0.0, "contiguous"),
               ("all zero (an all-false mask)", (3, 4), 1.0, "contiguous"), ("empty", (0, 3), 0.5, "contiguous"),
               ("scalar nonzero", (), 0.0, "contiguous"), ("scalar zero", (), 1.0, "contiguous"),
               ("4-d", (2, 3, 2, 3), 0.5, "contiguous"), ("transposed", (5, 6), 0.5, "transposed"),
               ("strided", (4, 6), 0.5, "strided"), ("large", (256, 512), 0.3, "contiguous")]
    cases = [Case(op, label, g.dtype, {"self": values(*shape, zeros=zeros, layout=layout)},
                  lambda d: (torch.nonzero(d["self"]),)) for label, shape, zeros, layout in layouts]
    if g.dtype.is_floating_point:
        x = torch.tensor([[0.0, float("nan")], [-0.0, 1.5]], dtype=g.dtype)
        cases.append(Case(op, "NaN is nonzero, -0 is zero", g.dtype, {"self": x},
                          lambda d: (torch.nonzero(d["self"]),)))
    return cases


_FAMILIES: dict[str, Callable[[OpSchema, _Gen], list[Case]]] = {}
for _name in ("aten::add.Tensor", "aten::sub.Tensor", "aten::mul.Tensor", "aten::div.Tensor", "aten::neg", "aten::exp",
              "aten::rsqrt", "aten::sigmoid", "aten::silu", "aten::gelu", "aten::pow.Tensor_Scalar", "aten::reciprocal",
              "aten::sqrt", "aten::log", "aten::cos", "aten::sin", "aten::addcmul", "aten::addcdiv",
              "aten::lerp.Scalar", "aten::relu", "aten::threshold_backward",
              "aten::silu_backward", "aten::gelu_backward", "aten::sigmoid_backward"):
    _FAMILIES[_name] = _elementwise
_FAMILIES.update({n: _matmul for n in ("aten::mm", "aten::bmm", "aten::linear", "aten::addmm")})
_FAMILIES.update({n: _softmax for n in ("aten::_softmax", "aten::_softmax_backward_data", "aten::_log_softmax",
                                        "aten::_log_softmax_backward_data")})
_FAMILIES.update({n: _rms_norm for n in ("aten::_fused_rms_norm", "aten::_fused_rms_norm_backward")})
_FAMILIES["ext::rotary_embedding"] = _rotary
_FAMILIES.update({n: _attention for n in ("aten::_scaled_dot_product_flash_attention_for_cpu",
                                          "aten::_scaled_dot_product_flash_attention_for_cpu_backward")})
_FAMILIES.update({n: _embedding for n in ("aten::embedding", "aten::embedding_dense_backward")})
_FAMILIES.update({n: _nll for n in ("aten::nll_loss_forward", "aten::nll_loss_backward")})
_FAMILIES.update({n: _reductions for n in ("aten::sum.dim_IntList", "aten::mean.dim", "aten::max.dim",
                                           "aten::linalg_vector_norm")})
_FAMILIES.update({n: _data_movement for n in ("aten::_to_copy", "aten::copy_", "aten::fill_.Scalar", "aten::clone")})
_FAMILIES["ext::adamw"] = _adamw
_FAMILIES.update({n: _selection for n in ("aten::pow.Scalar", "aten::cat", "aten::tril", "aten::where.self")})
_FAMILIES["aten::_safe_softmax"] = _safe_softmax
_FAMILIES["aten::slice_backward"] = _slice_backward
_FAMILIES.update({"aten::ge.Scalar": _compare, "aten::lt.Scalar": _compare, "aten::bitwise_and.Tensor": _bitwise,
                  "aten::clamp": _clamp, "aten::gather": _gather,
                  "aten::index.Tensor": _indexing, "aten::index_put": _indexing, "aten::arange.start_step": _arange,
                  "aten::nonzero": _nonzero})


def _numel(shape: Any) -> int:
    return math.prod(shape)


def _reduced(shape: tuple, dims: list[int]) -> int:
    """Elements summed into one output element by a reduction over ``dims`` (none: every dim)."""
    if not shape:
        return 1
    return _numel(shape) if not dims else _numel(shape[d] for d in dims)


def _annotate(c: Case) -> Case:
    """The case's reduction length and error scale (see Case), by operator."""
    a, d = c.op.aten, c.inputs
    if a in ("aten::add.Tensor", "aten::sub.Tensor", "ext::rotary_embedding"):
        c.reduction_length, c.magnitude = 2, "scale"  # two terms that may cancel
    elif a == "aten::lerp.Scalar":
        c.reduction_length, c.magnitude = 2, "scale"
    elif a in ("aten::addcmul", "aten::addcdiv", "ext::adamw"):
        c.reduction_length, c.magnitude = 3, "scale"
    elif a in ("aten::mm", "aten::bmm"):
        c.reduction_length, c.magnitude = d["self"].shape[-1] + 1, "abs"
    elif a == "aten::addmm":
        c.reduction_length, c.magnitude = d["mat1"].shape[-1] + 1, "abs"
    elif a == "aten::linear":
        c.reduction_length, c.magnitude = d["input"].shape[-1] + 1, "abs"
    elif "softmax" in a:
        x = d.get("self", d.get("output"))
        c.reduction_length = x.shape[d["dim"]] if x.dim() else 1
        c.magnitude = None if a in ("aten::_softmax", "aten::_safe_softmax") else "scale"
    elif a in ("aten::sum.dim_IntList", "aten::mean.dim"):
        c.reduction_length, c.magnitude = _reduced(tuple(d["self"].shape), d["dim"]), "abs"
    elif a == "aten::linalg_vector_norm":
        c.reduction_length = _reduced(tuple(d["self"].shape), d["dim"])
    elif a == "aten::_fused_rms_norm":
        c.reduction_length = _numel(d["normalized_shape"])
    elif a == "aten::_fused_rms_norm_backward":
        n = _numel(d["normalized_shape"])
        c.reduction_length, c.magnitude = max(n, d["input"].numel() // max(n, 1)) + 2, "scale"
    elif a.startswith("aten::_scaled_dot_product_flash_attention_for_cpu"):
        (_, _, s, e), key_len = d["query"].shape, d["key"].shape[-2]
        c.reduction_length = key_len + e + (s if a.endswith("_backward") else 0)
        c.magnitude = "scale"
    elif a == "aten::embedding_dense_backward":
        c.reduction_length, c.magnitude = max(d["indices"].numel(), 1), "abs"
    elif a == "aten::nll_loss_forward" and d["reduction"] != 0:
        c.reduction_length, c.magnitude = max(d["target"].numel(), 1), "abs"
    elif a == "aten::index_put" and d["accumulate"]:
        c.reduction_length, c.magnitude = d["values"].numel() + 1, "abs"
    return c


def cases_for(op_name: str, seed: int = 0, quick: bool = False) -> list[Case]:
    """Every case of one operator, for every dtype it declares (``quick``: without the large ones; the
    "long" ones, which reach a reduction's long-row path at little cost, stay)."""
    op = BY_NAME[op_name]
    cases = []
    for i, dtype_name in enumerate(op.dtypes):
        cases += _FAMILIES[op_name](op, _Gen(DTYPE_NAMES[dtype_name], seed * 1000 + i))
    return [_annotate(c) for c in cases if not (quick and "large" in c.label)]


def missing_generators() -> list[str]:
    return [name for name in BY_NAME if name not in _FAMILIES]
