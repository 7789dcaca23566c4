"""Random ops judged by what their draws must satisfy, on the run's own inputs and outputs: no
reference can reproduce another device's (or seed's) draws, and a direct comparison with the
reference run's draws blames honest randomness, or, after a divergence, inherited drift.

- ``native_dropout(x, p, train)``: the output is x * mask / (1 - p) exactly where the returned mask
  says (float64 recomputation, the dtype's tolerance), and the mask keeps 1 - p of the elements.
- ``bernoulli``/``bernoulli_``: every draw is 0 or 1, and their mean is the mean probability.
- ``uniform_(a, b)``: draws in [a, b], mean (a + b) / 2; ``normal_(m, s)``, ``randn``: mean m and
  standard deviation s. ``rand``: as ``uniform_(0, 1)``.
A mean is judged within 6 standard errors (a false alarm about once in 500 million honest calls);
below ``MIN_DRAWS`` draws only the exact parts are judged; a NaN or Inf draw fails. Each contract but
dropout's reads only the draws' count, extremes, mean and mean of squares (``Summary``), so a stats
capture's statistics, which hold no draws, serve it too (``stats_contract_verdict``)."""
from __future__ import annotations

import math

import torch

from .metrics import compare_tensors

MIN_DRAWS = 64
_SIGMAS = 6.0


def _arg(func, args, kwargs, name: str, default=None):
    for i, a in enumerate(func._schema.arguments):
        if a.name == name:
            if name in kwargs:
                return kwargs[name]
            return args[i] if i < len(args) else (a.default_value if a.has_default_value() else default)
    return default


def _first(outputs) -> torch.Tensor | None:
    if isinstance(outputs, torch.Tensor):
        return outputs
    if isinstance(outputs, (list, tuple)) and outputs and isinstance(outputs[0], torch.Tensor):
        return outputs[0]
    return None


def _mean_check(what: str, n: int, got: float, mean: float, std: float) -> tuple[str, str] | None:
    """None when the mean ``got`` of ``n`` draws is within the bound (or there are too few to judge)."""
    if n < MIN_DRAWS:
        return None
    bound = _SIGMAS * std / math.sqrt(n) + 1e-12
    if abs(got - mean) > bound:
        return "fail", (f"{what}: mean of {n} draws {got:.6g}, expected {mean:.6g} "
                        f"(bound {bound:.3g}, 6 standard errors)")
    return None


# What the contracts read of the draws: their count, least and greatest value, mean and mean of squares
# (float64). A full capture takes them from the draws, a stats capture from their statistics.
Summary = tuple[int, float, float, float, float]
# The mean of squares of values in [0, 1] equals their mean only where each is 0 or 1 (x (1 - x) = 0); a
# statistics record's norm, squared, rounds it by a few float64 ulps
_SQUARES_EXACT = 1e-13


def _bernoulli(d: Summary, p_mean: float, p_std: float) -> tuple[str, str]:
    n, lo, hi, mean, squares = d
    if n and (lo < 0 or hi > 1 or abs(squares - mean) > _SQUARES_EXACT):
        return "fail", (f"bernoulli draws other than 0 and 1 (min {lo:.6g}, max {hi:.6g}, mean of squares "
                        f"{squares:.9g} against mean {mean:.9g})")
    return _mean_check("bernoulli", n, mean, p_mean, p_std) or ("pass", f"bernoulli draws of mean {mean:.4g}")


def _uniform(d: Summary, a: float, b: float) -> tuple[str, str]:
    n, lo, hi, mean, _ = d
    if n and (lo < a or hi > b):
        return "fail", f"uniform draws outside [{a}, {b}] (min {lo:.6g}, max {hi:.6g})"
    return _mean_check("uniform", n, mean, (a + b) / 2, (b - a) / math.sqrt(12)) or ("pass", "uniform draws")


def _normal(d: Summary, m: float, s: float) -> tuple[str, str]:
    n, _, _, mean, squares = d
    bad = _mean_check("normal", n, mean, m, s)
    if bad is None and s > 0:  # the variance: (n-1) s^2 chi-square, sd s^2 sqrt(2/n); the mean of (x - m)^2
        bad = _mean_check("normal variance", n, squares - 2 * m * mean + m * m, s * s, s * s * math.sqrt(2))
    return bad or ("pass", "normal draws")


def _summary(x: torch.Tensor) -> Summary | None:
    """The draws' Summary; None where one is not finite."""
    x = x.detach().to("cpu", torch.float64)
    if not bool(torch.isfinite(x).all()):
        return None
    if not x.numel():
        return 0, 0.0, 0.0, 0.0, 0.0
    return x.numel(), float(x.min()), float(x.max()), float(x.mean()), float((x * x).mean())


_BERNOULLI = ("aten::bernoulli", "aten::bernoulli_")
_UNIFORM = ("aten::uniform_", "aten::rand", "aten::rand_like")
_NORMAL = ("aten::normal_", "aten::randn", "aten::randn_like")


def contract_verdict(func, args, kwargs, outputs) -> tuple[str, str] | None:
    """(status, detail) of a random op by its contract, or None when this op has none."""
    name = func._schema.name
    if name == "aten::native_dropout":
        return _dropout(func, args, kwargs, outputs)
    out = _first(outputs)
    if out is None or name not in _BERNOULLI + _UNIFORM + _NORMAL or not (out.is_floating_point()
                                                                         or name in _BERNOULLI):
        return None
    d = _summary(out)
    if d is None:
        return "fail", "NaN or Inf among the draws"
    if name in _BERNOULLI:
        p = _arg(func, args, kwargs, "p")
        if p is None:  # aten::bernoulli(self): the probabilities are the input
            p = args[0]
        if isinstance(p, torch.Tensor):
            probs = p.detach().to("cpu", torch.float64).expand_as(out)
        else:
            probs = torch.full(out.shape, float(p), dtype=torch.float64)
        return _bernoulli(d, float(probs.mean()), math.sqrt(float((probs * (1 - probs)).mean())))
    if name in _UNIFORM:
        own = name == "aten::uniform_"  # rand, rand_like: [0, 1)
        return _uniform(d, float(_arg(func, args, kwargs, "from", 0.0)) if own else 0.0,
                        float(_arg(func, args, kwargs, "to", 1.0)) if own else 1.0)
    own = name == "aten::normal_"  # randn, randn_like: mean 0, deviation 1
    return _normal(d, float(_arg(func, args, kwargs, "mean", 0.0)) if own else 0.0,
                   float(_arg(func, args, kwargs, "std", 1.0)) if own else 1.0)


def _number(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def stats_contract_verdict(op: str, signature: dict | None, stats: list | None) -> tuple[str, str] | None:
    """(status, detail) of a random op of a stats capture by the same contracts, read from its first
    output's statistics (min, max, mean and norm: tensor_stats' fields), or None when they say nothing (no
    statistics, a probability given as a tensor, an op with no contract). ``signature``: the record's
    arguments (its scalars by name; a default left out)."""
    if not stats or not isinstance(stats[0], dict) or not isinstance(signature, dict):
        return None
    st = stats[0]
    n, lo, hi, mean, norm = (st.get(k) for k in ("numel", "min", "max", "mean", "norm"))
    if not isinstance(n, int) or n <= 0 or None in (lo, hi, mean, norm):
        return None
    if st.get("nan") or st.get("inf"):
        return "fail", f"{st.get('nan')} NaN and {st.get('inf')} Inf among the draws"
    d = (n, lo, hi, mean, norm * norm / n)
    if op == "aten::bernoulli_" and (p := _number(signature.get("p"))) is not None:
        return _bernoulli(d, p, math.sqrt(p * (1 - p)))
    if op == "aten::uniform_":
        a, b = _number(signature.get("from", 0.0)), _number(signature.get("to", 1.0))
        return None if a is None or b is None else _uniform(d, a, b)
    if op == "aten::normal_":
        m, s = _number(signature.get("mean", 0.0)), _number(signature.get("std", 1.0))
        return None if m is None or s is None else _normal(d, m, s)
    return None


def _dropout(func, args, kwargs, outputs) -> tuple[str, str] | None:
    if not (isinstance(outputs, (list, tuple)) and len(outputs) == 2):
        return None
    out, mask = outputs
    x = args[0]
    p = float(_arg(func, args, kwargs, "p", 0.0))
    train = _arg(func, args, kwargs, "train", True)
    if not train or p == 0:
        expected = x.detach().to("cpu", torch.float64)
    elif p >= 1:
        expected = torch.zeros_like(x, device="cpu", dtype=torch.float64)
    else:
        keep = mask.detach().to("cpu", torch.float64)
        expected = x.detach().to("cpu", torch.float64) * keep / (1 - p)
        bad = _mean_check("dropout mask", keep.numel(), float(keep.mean()) if keep.numel() else 0.0, 1 - p,
                          math.sqrt(p * (1 - p)))
        if bad is not None:
            return bad
    verdict = compare_tensors(out, expected)
    if not verdict.passed:
        return "fail", f"dropout output is not input x mask / (1 - p): {verdict.detail}"
    return "pass", "dropout output is input x mask / (1 - p); its mask keeps 1 - p"
