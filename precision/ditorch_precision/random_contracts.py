"""Random ops judged by what their draws must satisfy, on the run's own inputs and outputs: no
reference can reproduce another device's (or seed's) draws, and a direct comparison with the
reference run's draws blames honest randomness, or, after a divergence, inherited drift.

- ``native_dropout(x, p, train)``: the output is x * mask / (1 - p) exactly where the returned mask
  says (float64 recomputation, the dtype's tolerance), and the mask keeps 1 - p of the elements.
- ``bernoulli``/``bernoulli_``: every draw is 0 or 1, and their mean is the mean probability.
- ``uniform_(a, b)``: draws in [a, b], mean (a + b) / 2; ``normal_(m, s)``, ``randn``: mean m and
  standard deviation s. ``rand``: as ``uniform_(0, 1)``.
A mean is judged within 6 standard errors (a false alarm about once in 500 million honest calls);
below ``MIN_DRAWS`` draws only the exact parts are judged. A stats capture holds no draws, only their
statistics: ``stats_contract_verdict`` judges ``bernoulli_``, ``uniform_`` and ``normal_`` from those."""
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


def _mean_check(what: str, draws: torch.Tensor, mean: float, std: float) -> tuple[str, str] | None:
    """None when the draws' mean is within the bound (or there are too few to judge)."""
    n = draws.numel()
    return None if n < MIN_DRAWS else _stats_mean_check(what, n, float(draws.double().mean()), mean, std)


def _stats_mean_check(what: str, n: int, got: float, mean: float, std: float) -> tuple[str, str] | None:
    """_mean_check of ``n`` draws whose mean is ``got``."""
    if n < MIN_DRAWS:
        return None
    bound = _SIGMAS * std / math.sqrt(n) + 1e-12
    if abs(got - mean) > bound:
        return "fail", (f"{what}: mean of {n} draws {got:.6g}, expected {mean:.6g} "
                        f"(bound {bound:.3g}, 6 standard errors)")
    return None


def contract_verdict(func, args, kwargs, outputs) -> tuple[str, str] | None:
    """(status, detail) of a random op by its contract, or None when this op has none."""
    name = func._schema.name
    if name == "aten::native_dropout":
        return _dropout(func, args, kwargs, outputs)
    out = _first(outputs)
    if out is None or not (out.is_floating_point() or name.startswith("aten::bernoulli")):
        return None
    x = out.detach().to("cpu", torch.float64)
    if name in ("aten::bernoulli", "aten::bernoulli_"):
        if not bool(((x == 0) | (x == 1)).all()):
            return "fail", "bernoulli draws other than 0 and 1"
        p = _arg(func, args, kwargs, "p")
        if p is None:  # aten::bernoulli(self): the probabilities are the input
            p = args[0]
        if isinstance(p, torch.Tensor):
            probs = p.detach().to("cpu", torch.float64).expand_as(x)
        else:
            probs = torch.full_like(x, float(p))
        mean = float(probs.mean())
        std = math.sqrt(float((probs * (1 - probs)).mean()))
        return _mean_check("bernoulli", x, mean, std) or ("pass", f"bernoulli draws of mean {float(x.mean()):.4g}")
    if name == "aten::uniform_" or name in ("aten::rand", "aten::rand_like"):
        a = float(_arg(func, args, kwargs, "from", 0.0)) if name == "aten::uniform_" else 0.0
        b = float(_arg(func, args, kwargs, "to", 1.0)) if name == "aten::uniform_" else 1.0
        if x.numel() and (float(x.min()) < a or float(x.max()) > b):
            return "fail", f"uniform draws outside [{a}, {b}]"
        return _mean_check("uniform", x, (a + b) / 2, (b - a) / math.sqrt(12)) or ("pass", "uniform draws")
    if name in ("aten::normal_", "aten::randn", "aten::randn_like"):
        m = float(_arg(func, args, kwargs, "mean", 0.0)) if name == "aten::normal_" else 0.0
        s = float(_arg(func, args, kwargs, "std", 1.0)) if name == "aten::normal_" else 1.0
        bad = _mean_check("normal", x, m, s)
        if bad is None and x.numel() >= MIN_DRAWS and s > 0:  # the variance: (n-1) s^2 chi-square, sd s^2 sqrt(2/n)
            bad = _mean_check("normal variance", (x - m) ** 2, s * s, s * s * math.sqrt(2))
        return bad or ("pass", "normal draws")
    return None


def _number(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def stats_contract_verdict(op: str, signature: dict | None, stats: list | None) -> tuple[str, str] | None:
    """(status, detail) of a random op of a stats capture by what its draws' statistics must satisfy (the
    contracts above, from min, max, mean and norm), or None when they say nothing (no statistics, a
    probability given as a tensor, an op with no contract). ``signature``: the record's scalar arguments."""
    if not stats or not isinstance(stats[0], dict) or not isinstance(signature, dict):
        return None
    st = stats[0]
    n, lo, hi, mean, norm = (st.get(k) for k in ("numel", "min", "max", "mean", "norm"))
    if not isinstance(n, int) or n <= 0 or None in (lo, hi, mean, norm):
        return None
    if st.get("nan") or st.get("inf"):
        return "fail", f"{st.get('nan')} NaN and {st.get('inf')} Inf among the draws"
    square_mean = norm * norm / n
    if op == "aten::bernoulli_" and (p := _number(signature.get("p"))) is not None:
        # values in [0, 1] whose squares sum to their sum are each 0 or 1 (x (1 - x) = 0)
        if lo < 0 or hi > 1 or abs(square_mean - mean) > 1e-9:
            return "fail", f"bernoulli draws other than 0 and 1 (min {lo:.6g}, max {hi:.6g}, mean of squares " \
                           f"{square_mean:.9g} against mean {mean:.9g})"
        return _stats_mean_check("bernoulli", n, mean, p, math.sqrt(p * (1 - p))) or \
            ("pass", f"bernoulli draws of mean {mean:.4g}")
    if op == "aten::uniform_":
        a, b = _number(signature.get("from", 0.0)), _number(signature.get("to", 1.0))
        if a is None or b is None:
            return None
        if lo < a or hi > b:
            return "fail", f"uniform draws outside [{a}, {b}] (min {lo:.6g}, max {hi:.6g})"
        return _stats_mean_check("uniform", n, mean, (a + b) / 2, (b - a) / math.sqrt(12)) or ("pass", "uniform draws")
    if op == "aten::normal_":
        m, s = _number(signature.get("mean", 0.0)), _number(signature.get("std", 1.0))
        if m is None or s is None:
            return None
        bad = _stats_mean_check("normal", n, mean, m, s)
        if bad is None and s > 0:  # the mean of (x - m)^2 from the mean of squares and the mean
            spread = square_mean - 2 * m * mean + m * m
            bad = _stats_mean_check("normal variance", n, spread, s * s, s * s * math.sqrt(2))
        return bad or ("pass", "normal draws")
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
        bad = _mean_check("dropout mask", keep, 1 - p, math.sqrt(p * (1 - p)))
        if bad is not None:
            return bad
    verdict = compare_tensors(out, expected)
    if not verdict.passed:
        return "fail", f"dropout output is not input x mask / (1 - p): {verdict.detail}"
    return "pass", "dropout output is input x mask / (1 - p); its mask keeps 1 - p"
