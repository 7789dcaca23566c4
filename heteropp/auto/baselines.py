"""Cheap baselines that every `--algo auto` plan is checked against, by simulation (issue 30).

The search is exact only in its own space and within its budget; beyond, its plan can be slower than a
plan a one-line rule finds (1,024 chips of 3 types on slow links: 268.9 s against 35.6 s for the
H200s alone). So `planning.run_search` also simulates, with each one's best schedule parameters:

* **h2**: the paper's algorithm (`h2.search_h2`), where its two-stage DFS stays cheap (at most
  `H2_MAX_TYPES` chip types and `H2_MAX_CHIPS` chips);
* **subsets of chip types**: the cluster with only some types, the others idle, searched as a cluster of
  its own (its plan is valid on the whole cluster) by the search and its ranking. Every proper subset
  up to `ALL_SUBSETS_TYPES` types; beyond, each type alone, and the types ranked by their FLOPs taken 2,
  3, ... at a time (on clusters of more than `LARGE_CHIPS` chips, 2 and 3 at a time: each sub-search
  costs about what the search does);
* **rounded counts**: the cluster with each type's count rounded down to a multiple of 2^j, j = 1 .. 9
  (chips dropped, so a count one above a round number plans at least as well as the round number does,
  and a count whose every dp leaves chips over plans as the counts each dp can use do; on clusters of
  more than `LARGE_CHIPS` chips, multiples of 8 only; a rounded cluster is planned with its
  other baselines, not its own roundings);
* **mixed rounded counts**: each type's count rounded by a power of two of its own, or (on clusters of at
  most `FEWER_CHIPS` chips) less one chip or one node (up to `MIXED_ROUNDINGS` sub-clusters, the most chips
  first, none beyond `LARGE_CHIPS` chips), searched as the subsets are;
* **FLOPs-proportional split**: every chip at its type's largest TP size, types in memory-descending
  order, layers in proportion to each stage's peak FLOPs, recompute where a stage needs it, at each dp;
* **descent** (on clusters of at most `FEWER_CHIPS` chips), a local search over sub-clusters: from the chips
  the fastest plan so far uses, one type's count less one chip, less one node, rounded down by a power of
  two, or none of it (where another type is used), or, for a type the plan leaves idle, a node or a power of
  two more of it; each searched as the subsets are; then from the chips of the fastest plan not yet started
  from among the `DESCENT_STARTS` fastest, at most `DESCENT_SUBS` sub-clusters in all. 17 + 64 + 65 chips
  planned on 16 + 64 + 64 (9.338 s) while 8 + 64 + 64, two steps from the counts, plans at 9.283 s;
  100 + 13 + 15 planned on 100 + 8 + 12 (18.280 s) while 96 + 0 + 12 plans at 17.397 s, a step from the
  second fastest; 32 + 51 + 51 planned on 0 + 48 + 48 (3.358 s) while 8 + 48 + 48 plans at 3.272 s.

The returned plan is the fastest by simulation of the search's plan and these: never slower than any.
The sub-searches share the search's work budget (each gets `SUB_WORK_SHARE` of it), so the whole stays
deterministic.
"""
from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import replace
from typing import Any, Callable, Iterator

from ..spec import Cluster, InfeasibleError
from .candidates import Candidate, SearchResult
from .costs import CostModel, StageSpec, in_flight, micro_batches
from .limits import Limits, relaxed_bound
from .space import divisors, dp_candidates, tp_counts, tp_sizes

# planning.Problem (not imported: planning calls this module) and its run_search, passed in
Problem = Any
Plan = Callable[[Any, Limits, bool], SearchResult]  # (problem, limits, with its baselines)

ALL_SUBSETS_TYPES = 4  # every proper subset of up to this many types (14 for 4); beyond, singles and prefixes
# h2's DFS over every order of the types and then of groups: beyond these it costs more than the search
# (1,024 chips of 8 types: minutes)
H2_MAX_TYPES = 4
H2_MAX_CHIPS = 2432  # the paper's largest experiment (Exp-D); 3 x 1,024 chips took minutes
SUB_WORK_SHARE = 8  # each sub-search's work budget: the search's over this
# counts rounded down to multiples of 2^j (2 to 512 chips): a plan of dp replicas uses a multiple of dp chips
# of each type, and the dps are the global batch's divisors, powers of two in practice
ROUNDINGS = tuple(range(1, 10))
LARGE_ROUNDINGS = (3,)  # on clusters of more than LARGE_CHIPS chips: multiples of 8 only
LARGE_CHIPS = 8192  # beyond, fewer sub-searches (100,000 chips x 8 types: ~1.3 s of CPU each)
MIXED_ROUNDINGS = 24  # mixed_rounded_counts: at most this many sub-clusters, each a sub-search
# mixed_rounded_counts also takes a chip or a node off a type on clusters of at most this many chips: beyond,
# those sub-clusters are seldom pruned and cost what the search does each (Exp-A, 768 chips: 0.1 -> 1.2 s)
FEWER_CHIPS = 512
FLOPS_DPS = 4  # the FLOPs-proportional split at the smallest dps that fit (each one simulation)
DESCENT_SUBS = 24  # descent: at most this many sub-clusters, each a sub-search
DESCENT_STARTS = 3  # descent: it starts from the chips of the fastest plans among these many


def sub_cluster(cl: Cluster, counts: dict[str, int]) -> Cluster:
    """`cl` with the given types at the given counts (others dropped), links among them kept."""
    chips = tuple(replace(c, count=counts[c.name]) for c in cl.chips if counts.get(c.name))
    names = {c.name for c in chips}
    return replace(cl, chips=chips, links={k: v for k, v in cl.links.items() if set(k) <= names},
                   link_latency={k: v for k, v in cl.link_latency.items() if set(k) <= names})


def type_subsets(cl: Cluster) -> list[tuple[str, ...]]:
    """The proper subsets of chip types searched as clusters of their own (see the module's docstring)."""
    names = [c.name for c in cl.chips]
    n = len(names)
    if n <= 1:
        return []
    if n <= ALL_SUBSETS_TYPES:
        return [s for k in range(1, n) for s in itertools.combinations(names, k)]
    flops = sorted(cl.chips, key=lambda c: (-c.count * c.peak_tflops * c.efficiency, c.name))
    out: list[tuple[str, ...]] = [(c.name,) for c in cl.chips]
    most = n if cl.total_chips <= LARGE_CHIPS else min(n, 4)
    out += [tuple(c.name for c in flops[:k]) for k in range(2, most)]
    return out


def rounded_counts(cl: Cluster) -> list[dict[str, int]]:
    """Each type's count of at least 2^j rounded down to a multiple of 2^j (ROUNDINGS; smaller counts
    kept), where that drops chips; distinct ones only. A cluster of N + k chips of a type, N a multiple of
    2^j and k < 2^j, so gets the plan of N chips, which the planner returns for N itself."""
    out: list[dict[str, int]] = []
    for j in ROUNDINGS if cl.total_chips <= LARGE_CHIPS else LARGE_ROUNDINGS:
        g = 1 << j
        counts = {c.name: c.count // g * g if c.count >= g else c.count for c in cl.chips}
        if all(counts[c.name] == c.count for c in cl.chips) or counts in out:
            continue
        out.append(counts)
    return out


def mixed_rounded_counts(cl: Cluster, limit: int = MIXED_ROUNDINGS) -> list[dict[str, int]]:
    """Each type's count rounded down by its own 2^j (ROUNDINGS), or kept, or on clusters of at most
    FEWER_CHIPS chips less one chip or one node, where the types' choices differ from rounded_counts' one j
    for every type: 65 + 25 chips plan best on 64 + 24, which 73 + 25 reaches only with 64 from one type and
    24 from the other; 48 + 24 + 64 chips plan faster than 48 + 32 + 64 use them all, a node of the slow type
    less. At most `limit`, the most chips first (on a tie, those that change fewer types), enumerated lazily
    (the whole product would be millions of sub-clusters on 8 types); none on clusters of more than
    LARGE_CHIPS chips. Most chips first, not fewer types changed first: a chip more of one type then shifts
    the list by that chip instead of pushing its sub-clusters that change every type out of it (29 + 16 + 85
    chips plan on 28 + 16 + 80, which 29 + 17 + 85 reached only as a third type changed, 9.6% slower)."""
    if cl.total_chips > LARGE_CHIPS:
        return []
    fewer = cl.total_chips <= FEWER_CHIPS
    # per type, its own count and then the others, the most first
    values = [[c.count, *sorted({*(c.count // (1 << j) << j for j in ROUNDINGS if c.count >= 1 << j),
                                 *(c.count - k for k in (1, c.chips_per_node) if c.count > k and fewer)} - {c.count},
                                reverse=True)] for c in cl.chips]
    uniform = rounded_counts(cl)

    def key(at: tuple[int, ...]) -> tuple[int, int, tuple[int, ...]]:  # chips dropped, types changed, choice
        return sum(v[0] - v[i] for v, i in zip(values, at)), sum(1 for i in at if i), at

    out: list[dict[str, int]] = []
    start = (0,) * len(values)
    heap, seen = [key(start)], {start}
    while heap and len(out) < limit:
        at = heapq.heappop(heap)[2]
        counts = {c.name: v[i] for c, v, i in zip(cl.chips, values, at)}
        if any(at) and counts not in uniform:
            out.append(counts)
        for t in range(len(at)):
            if at[t] + 1 < len(values[t]):
                nxt = at[:t] + (at[t] + 1,) + at[t + 1:]
                if nxt not in seen:
                    seen.add(nxt)
                    heapq.heappush(heap, key(nxt))
    return out


def flops_split(cm: CostModel, limit: int = FLOPS_DPS) -> Iterator[Candidate]:
    """Every chip serving at its type's largest TP size, types in memory-descending order, layers in
    proportion to each stage's peak FLOPs (largest remainders), recompute where a stage's share needs it;
    at the smallest `limit` dps where that fits."""
    L, counts = cm.model.layers, tp_counts(cm.model)
    chips = sorted(cm.cluster.chips, key=lambda c: (-c.memory_gb, c.name))
    try:
        dps = dp_candidates(cm.cluster, cm.train)
    except InfeasibleError:
        return
    found = 0
    for dp in dps:
        seq: list[tuple[str, int]] = []
        for c in chips:
            fits = [t for t in tp_sizes(c, *counts) if (c.count // dp) % t == 0]
            if c.count % dp or not fits:
                seq = []
                break
            t = max(fits)
            seq += [(c.name, t)] * (c.count // dp // t)
        if not seq or len(seq) > L:
            continue
        w = [t * cm.cluster.chip(n).peak_tflops * cm.cluster.chip(n).efficiency for n, t in seq]
        share = [L * x / sum(w) for x in w]
        layers = [max(1, math.floor(s)) for s in share]
        for k in sorted(range(len(seq)), key=lambda k: (-(share[k] - math.floor(share[k])), k)):
            if sum(layers) >= L:
                break
            layers[k] += 1
        while sum(layers) > L:  # the max(1, ...) floor gave too many: take from the largest
            layers[max(range(len(layers)), key=lambda k: (layers[k], -k))] -= 1
        b, p = micro_batches(cm.train, dp), len(seq)
        stages = []
        for k, ((name, t), n) in enumerate(zip(seq, layers)):
            fl = in_flight(cm.train.schedule, k, p, b)
            r = next((r for r in (False, True) if n <= cm.max_layers(name, t, r, dp, fl, k == 0, k == p - 1)), None)
            if r is None:
                break
            stages.append(StageSpec(name, t, n, r))
        else:
            est = cm.evaluate(stages, dp, b)
            if est.feasible:
                yield Candidate(est.iteration_time_s, dp, stages, f"FLOPs-proportional split dp={dp}")
                found += 1
                if found >= limit:
                    return


def used_counts(c: Candidate) -> dict[str, int]:
    """The chips of each type plan `c` uses."""
    out: dict[str, int] = {}
    for s in c.stages:
        out[s.chip] = out.get(s.chip, 0) + s.tp * s.inner_dp * c.dp
    return out


def neighbours(cl: Cluster, used: dict[str, int]) -> list[dict[str, int]]:
    """The descent's next sub-clusters from `used` (a plan's chips per type): one type's count less one chip,
    less one node, rounded down to a multiple of 2^j (ROUNDINGS), or none where another type is used, or where
    the plan leaves chips of the type idle, one node or a power of two (up to the type's count) more; the other
    types as used; the most chips first, then in the cluster's type order."""
    out: list[dict[str, int]] = []
    types = sum(1 for n in used.values() if n)
    for c in cl.chips:
        n = used.get(c.name, 0)
        other = {n - 1, n - c.chips_per_node, *(n // (1 << j) << j for j in ROUNDINGS), 0}
        if n < c.count:  # a type the plan leaves (partly) idle: a node, or a power of two, more of it
            other |= {n + c.chips_per_node, *(1 << j for j in range(c.count.bit_length()) if 1 << j > n)}
        for k in sorted(v for v in other if 0 <= v <= c.count and v != n and (v or types > 1)):
            counts = {name: m for name, m in {**used, c.name: k}.items() if m}
            if counts not in out:
                out.append(counts)
    out.sort(key=lambda d: -sum(d.values()))
    return out


def candidates(pb: Problem, group_size: int, limits: Limits, idle: str, plan: Plan,
               sub_problem: Callable[[Cluster], Problem],
               best_s: Callable[[], float] = lambda: math.inf, rounded: bool = True,
               ranked: Callable[[], list[Candidate]] = lambda: []) -> Iterator[Candidate]:
    """The baselines' plans, each as its own search or rule returns it (not yet simulated). A sub-cluster
    whose lower bound on every plan (limits.relaxed_bound, below the cost model's estimate, which is below
    the simulator's time) is no less than `best_s()`, the fastest plan so far, is not searched: it cannot
    win. `plan`: the planner (planning.run_search); `sub_problem`: the problem of a sub-cluster; `ranked()`:
    the plans priced so far, the fastest first, where the descent starts."""
    from .h2 import search_h2
    cl = pb.cluster
    if len(cl.chips) <= H2_MAX_TYPES and cl.total_chips <= H2_MAX_CHIPS:
        try:
            yield _labelled(search_h2(pb.cm, group_size).best, "h2")
        except InfeasibleError:
            pass
    yield from flops_split(pb.cm)
    sub = replace(limits, work=limits.work // SUB_WORK_SHARE)
    subs = [({n: cl.chip(n).count for n in names}, False) for names in type_subsets(cl)]
    # rounded counts: planned as the planner plans that cluster itself (its own baselines, the full budget)
    subs += [(counts, True) for counts in (rounded_counts(cl) if rounded else [])]
    # mixed roundings: searched as the subsets are (a share of the budget, no baselines of their own)
    subs += [(counts, False) for counts in (mixed_rounded_counts(cl) if rounded else [])]

    def searched(counts: dict[str, int], whole: bool) -> Iterator[Candidate]:
        part = sub_cluster(cl, counts)
        spb = sub_problem(part)
        dps = [d for d in divisors(pb.train.micro_batches_total) if d <= part.total_chips]
        if relaxed_bound(spb.cm, dps) >= best_s():
            return
        try:
            # a subset: the search and its ranking (planning.run_search without baselines) on a share of
            # the budget; rounded counts: as the planner plans that cluster itself
            # (a rounded cluster's own roundings are not planned again: each level multiplied the cost)
            res = plan(spb, limits, True) if whole else plan(spb, sub, False)
        except InfeasibleError:
            return
        what = "+".join(f"{c.name}:{c.count}" for c in part.chips)
        yield _labelled(res.best, f"subset {what}")

    for counts, whole in subs:
        yield from searched(counts, whole)
    if not rounded or cl.total_chips > FEWER_CHIPS:
        return
    tried = [counts for counts, _ in subs] + [{c.name: c.count for c in cl.chips}]
    started: list[dict[str, int]] = []
    left = DESCENT_SUBS
    while left > 0:
        starts = [u for u in map(used_counts, ranked()[:DESCENT_STARTS]) if u not in started]
        if not starts:
            break
        started.append(starts[0])
        for counts in neighbours(cl, starts[0]):
            if counts in tried:
                continue
            tried.append(counts)
            left -= 1
            yield from searched(counts, False)
            if left == 0:
                break


def _labelled(c: Candidate, what: str) -> Candidate:
    return replace(c, label=f"baseline {what}: {c.label}")
