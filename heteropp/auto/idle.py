"""Plans that leave chips idle: for clusters where no dp lets every chip serve (10,000 chips and 96 layers
would need pipelines of hundreds of stages), or when asked (`heteroauto plan --idle`).

A bounded search over few, structured candidates: dp (a divisor of the micro-batch count), a total
pipeline depth P from a ladder, one TP size per chip type (its largest, or its cheapest per chip), and two
ways to share the P stages among the types (fastest stages first; in proportion to what each type can
hold). Types keep the memory-descending order, and every candidate stage sequence gets the exact optimal
layer split and recompute (split.py). Candidates are tried by their stages' speed (the bottleneck part of
their lower bound) and skipped when the whole lower bound cannot beat the best plan; the work budget
(limits.work: one unit per stage split) stops the rest. The result is bounded by construction and
carries limits.relaxed_bound, a lower bound on every plan with or without idle chips.
"""
from __future__ import annotations

import math
import time

from ..spec import InfeasibleError
from .costs import CostModel, StageSpec, micro_batches
from .inner_dp import with_inner_dp
from .limits import DEFAULT_LIMITS, Limits, relaxed_bound
from .candidates import Candidate, Progress, SearchResult
from .stageopts import stage_opts
from .space import divisors, tp_counts, tp_sizes
from .split import best_split

DEPTHS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)
SEEDS = 2


def _share(caps: list[int], rates: list[float], depth: int, fastest_first: bool) -> list[int]:
    """Stages per type, at most caps[i] each and `depth` in all (fewer when the caps are smaller)."""
    if fastest_first:
        out, left = [0] * len(caps), depth
        for i in sorted(range(len(caps)), key=lambda j: -rates[j]):
            out[i] = min(caps[i], left)
            left -= out[i]
        return out
    total = sum(caps)
    out = [min(c, (c * depth) // total) for c in caps] if total else [0] * len(caps)
    for i in sorted(range(len(caps)), key=lambda j: -caps[j]):  # the remainder to the largest types
        if sum(out) < min(depth, total) and out[i] < caps[i]:
            out[i] += 1
    return out


def search_idle(cm: CostModel, limits: Limits = DEFAULT_LIMITS, progress: Progress | None = None,
                runners_up: int = 3) -> SearchResult:
    t0 = time.perf_counter()
    L, counts = cm.model.layers, tp_counts(cm.model)
    chips = sorted(cm.cluster.chips, key=lambda c: -c.memory_gb)
    dps = [d for d in divisors(cm.train.micro_batches_total) if d <= cm.cluster.total_chips]
    trials = []  # (the stages' bottleneck bound, the sequence's lower bound, dp, stage sequence)
    for dp in dps:
        b = micro_batches(cm.train, dp)
        for policy in ("largest", "cheapest"):
            tps, caps, rates, fills = [], [], [], []
            for c in chips:
                ok = [t for t in tp_sizes(c, *counts) if t * dp <= c.count]
                if not ok:
                    tps.append(0)
                    caps.append(0)
                    rates.append(0.0)
                    fills.append(math.inf)
                    continue
                cost = {t: max(b * cm.coef(c.name, t, False, dp).tau - cm.coef(c.name, t, False, dp).beta, 1e-300)
                        for t in ok}
                t = max(ok) if policy == "largest" else min(ok, key=lambda x: cost[x] * x)
                tps.append(t)
                caps.append(min(L, c.count // (dp * t)))
                rates.append(1 / cost[t])
                fills.append(cm.coef(c.name, t, False, dp).beta)
            for depth in sorted({min(d, L) for d in DEPTHS}):
                for fastest in (True, False):
                    share = _share(caps, rates, depth, fastest)
                    rate = sum(s * r for s, r in zip(share, rates))
                    if not rate:
                        continue
                    seq = tuple((c.name, t) for c, t, s in zip(chips, tps, share) for _ in range(s))
                    # F >= the bottleneck (at least L / sum of the stages' rates) + the fill (at least L
                    # layers at the least per-layer fill share): a lower bound of this sequence's time
                    fill = min(f for f, s in zip(fills, share) if s)
                    trials.append((L / rate, L / rate + L * fill, dp, seq))
    # The first few by their stages' speed seed the best plan (they find good plans early); the rest go
    # in order of their whole lower bound, so the first that cannot win ends the search.
    trials = sorted(set(trials))
    trials = trials[:SEEDS] + sorted(trials[SEEDS:], key=lambda x: x[1])
    best: list[Candidate] = []
    stopped, work = None, 0
    for i, (_, low, dp, seq) in enumerate(trials):
        bound = best[0].time_s if best else math.inf
        if low >= bound:
            if i >= SEEDS:
                break
            continue
        capped = limits.time_cap_s is not None and time.perf_counter() - t0 > limits.time_cap_s
        if (work >= limits.work or capped) and best:
            what = f"work budget {limits.work:,} units" if work >= limits.work else f"time cap {limits.time_cap_s:g} s"
            stopped = f"{what} ({len(trials) - i} of {len(trials)} candidates left)"
            break
        work += len(seq)
        b = micro_batches(cm.train, dp)
        opts, lam, const = stage_opts(cm, list(seq), dp, b)
        res = best_split(opts, L, lam, const, bound)
        if res is None:
            continue
        stages = [StageSpec(ch, t, n, r) for (ch, t), n, r in zip(seq, res.layers, res.recompute)]
        used: dict[str, int] = {}
        for ch, t in seq:
            used[ch] = used.get(ch, 0) + t * dp
        label = f"dp={dp} idle " + " ".join(f"{c.name}:{c.count - used.get(c.name, 0)}" for c in chips)
        best = sorted(best + [Candidate(res.total, dp, stages, label)], key=lambda c: c.time_s)[:runners_up + 1]
        if progress:
            progress(f"idle-chip plans: {i + 1} of {len(trials)} candidates, best {best[0].time_s:.4f} s")
    if not best:
        raise InfeasibleError(f"no plan fits the {L}-layer model {cm.model.name!r} on cluster {cm.cluster.name!r} "
                              f"even with idle chips ({len(trials)} stage sequences tried, none fits memory)")
    bounded = ["chips may stay idle: structured candidates (dp, depth, one TP size per type)"]
    if stopped:
        bounded.append(stopped)
    low = relaxed_bound(cm, dps)
    return SearchResult(with_inner_dp(cm, best[0]), best[1:], len(trials), 0, time.perf_counter() - t0, bounded, low,
                        work=work)
