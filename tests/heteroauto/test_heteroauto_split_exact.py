"""split.best_split against every layer split (brute force over the compositions of L), on random stages whose
fill cost jumps where recompute starts (the non-linear case _min_fill solves by dynamic programming, one
layer count at a time for short stages and all counts at once for long ones) and whose caps make the level
scans skip fills that cannot win."""
from __future__ import annotations

import itertools
import random

import pytest

from heteropp.auto.split import best_split
from heteropp.auto.stagekind import StageTerms


def _splits(p: int, L: int):
    """Every split of L layers over p stages, at least one each."""
    for cuts in itertools.combinations(range(1, L), p - 1):
        bounds = (0, *cuts, L)
        yield [b - a for a, b in zip(bounds, bounds[1:])]


def _brute(opts: list[StageTerms], L: int, lam: float, const: float) -> float:
    best = float("inf")
    for ls in _splits(len(opts), L):
        if any(not o.ok(n) for o, n in zip(opts, ls)):
            continue
        t = (max(max(o.own(n) for o, n in zip(opts, ls)), lam) + max(o.y(n) for o, n in zip(opts, ls))
             + sum(o.phi(n) for o, n in zip(opts, ls)) + const)
        best = min(best, t)
    return best


def _stage(rng: random.Random, L: int) -> StageTerms:
    m0 = rng.randint(0, L)
    m1 = rng.randint(m0, L + 2)
    a = rng.uniform(0.5, 2.0)
    beta = rng.choice([0.0, rng.uniform(0.0, 1.0)])
    return StageTerms(a0=rng.uniform(0.0, 1.0), a=a, a1=a * rng.uniform(1.0, 1.5), m0=m0, m1=m1, beta=beta,
                      b0=rng.uniform(0.0, 0.5), beta1=beta + rng.uniform(0.0, 0.6), ups=rng.uniform(0.0, 0.3),
                      y0=rng.uniform(0.0, 0.2))


@pytest.mark.parametrize("seed", range(4))
def test_best_split_equals_the_brute_force_over_every_split(seed):
    rng = random.Random(seed)
    checked = 0
    for _ in range(60):
        p = rng.randint(1, 3)
        L = rng.randint(p, 24)  # stages of up to 22 layers: both of _min_fill's ways
        opts = [_stage(rng, L) for _ in range(p)]
        lam, const = rng.choice([float("-inf"), rng.uniform(0.0, 5.0)]), rng.uniform(0.0, 1.0)
        want = _brute(opts, L, lam, const)
        got = best_split(opts, L, lam, const)
        if want == float("inf"):
            assert got is None
            continue
        checked += 1
        assert got is not None and got.total == pytest.approx(want, rel=1e-12, abs=1e-12), (opts, L)
        assert sum(got.layers) == L
        assert got.total == pytest.approx(
            max(max(o.own(n) for o, n in zip(opts, got.layers)), lam) + max(o.y(n) for o, n in zip(opts, got.layers))
            + sum(o.phi(n) for o, n in zip(opts, got.layers)) + const, rel=1e-12)
    assert checked >= 30
