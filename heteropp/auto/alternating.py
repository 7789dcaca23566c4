"""When the compute of a schedule that alternates forwards and backwards (1F1B, H-1F1B, ZB-H1) can end at
the earliest, from how such a schedule runs: stage k runs n_k - 1 warm-up forwards (n_k = min(warm-up + 1,
b), the registry's round_trip_span), then alternates a forward and a backward, then drains its last n_k - 1
backwards. Both bounds are longest chains of actions the simulator must run one after another, so they hold
at every micro-batch count, and neither charges a run of micro-batches that does not exist (at few
micro-batches the warm-up and drain are most of the iteration).

Per micro-batch, stage k's forward is fs[k], its backward on the critical chain bs[k] (the input gradient
where weight passes are deferred) and its deferred weight pass ws[k] (0 where none is); boundary j's
transfer es[j] and latency lats[j]. Stage k holds back held[k] weight passes (the registry's
held_weight_passes; b where none are deferred, so none counts): after its backward y >= held[k] it runs a
weight pass, the rest after its last backward. The bounds are on the end of stage 0's last backward;
last_backward_ends gives every stage's (the update term of ZB-H1, whose stages end at different times).
"""
from __future__ import annotations

import math
from functools import lru_cache

Label = tuple[int, int, int, bool]  # a round-trip chain: (k, j, the stage it leaves for or -1, drain variant)


def _chains(fs: list[float], bs: list[float], es: list[float], lats: list[float],
            spans: list[int], b: int) -> tuple[list[float], list[float], list[float]]:
    """Per stage k: when its first forward can start (`pre`: micro-batch 0 through the stages and links
    before it), when its first backward can end (`first_back`), and how long its last backward's gradient
    still needs to reach stage 0 (`post`). A stage runs its first backward right after forward n_k - 1, and
    the forwards reach stage k no faster than the slowest stage or link before it passes them on (`up`)."""
    p = len(fs)
    hop = [e + x for e, x in zip(es, lats)]
    pre = [sum(fs[:k]) + sum(hop[:k]) for k in range(p)]
    post = [sum(bs[:k]) + sum(hop[:k]) for k in range(p)]
    first_back = [0.0] * p
    for k in reversed(range(p)):
        n = min(spans[k], b)
        up = max(fs[:k + 1] + es[:k])
        warm_end = pre[k] + fs[k] + (n - 1) * up  # forward n_k - 1 ends
        grad = first_back[k + 1] + hop[k] if k < p - 1 else 0.0  # gradient of micro-batch 0 arrives
        first_back[k] = max(warm_end, grad) + bs[k]
    return pre, first_back, post


def stage_ends(fs: list[float], bs: list[float], ws: list[float], es: list[float], lats: list[float],
               spans: list[int], b: int, held: list[int]) -> list[float]:
    """Per stage k, when its own timeline can end at the earliest (its last action, held-back weight passes
    included): it starts at pre_k, runs b forwards and b whole backwards, and waits twice. Before its first
    backward: for micro-batch 0's round trip through the later stages (first_back), or for its n_k
    forwards, which arrive at the pace of the slowest stage or link before it. After its last forward: its
    last backward needs that micro-batch's round trip (r_k, the later stages' passes and every link both
    ways), of which what it runs in between covers only its n_k - 1 drain backwards and the weight passes
    after them that it does not hold back."""
    return [end for end, _ in _timelines(fs, bs, ws, es, lats, spans, b, held)]


def _drain_waits(fs: list[float], bs: list[float], ws: list[float], es: list[float], lats: list[float],
                 spans: list[int], b: int, held: list[int]) -> tuple[float, ...]:
    """Per stage k, the least time from the end of its forward b - 1 to the start of its last backward. That
    forward reaches any stage i >= k, which runs backward b - n_i right after it; its gradient comes back
    to stage k, which then runs backwards b - n_i + 1 .. b - 1 (with the weight passes after those it does
    not hold back). i = k: stage k's own drain; i = p - 1: the whole round trip."""
    return _drain_waits_cached(tuple(fs), tuple(bs), tuple(ws), tuple(es), tuple(lats), tuple(spans), b,
                               tuple(held))


@lru_cache(maxsize=4)  # one estimate asks three times with the same arguments (both timelines, the round trips)
def _drain_waits_cached(fs: tuple[float, ...], bs: tuple[float, ...], ws: tuple[float, ...], es: tuple[float, ...],
                        lats: tuple[float, ...], spans: tuple[int, ...], b: int,
                        held: tuple[int, ...]) -> tuple[float, ...]:
    p = len(fs)
    out = []
    for k in range(p):
        best, trip = -math.inf, 0.0
        for i in range(k, p):
            if i > k:
                trip += fs[i] + bs[i] + 2 * (es[i - 1] + lats[i - 1])
            n = spans[i] if spans[i] < b else b
            h = b - n if b - n >= held[k] else held[k]  # max(0, v) and max(a, c) as comparisons: the same values
            v = trip + (n - 1) * bs[k] + (b - 1 - h if b - 1 - h > 0 else 0) * ws[k]
            if v > best:
                best = v
        out.append(best)
    return tuple(out)


def _timelines(fs: list[float], bs: list[float], ws: list[float], es: list[float], lats: list[float],
               spans: list[int], b: int, held: list[int]) -> list[tuple[float, float]]:
    """Per stage: stage_ends' value, and when its backwards can start running one after another (its first
    backward's earliest start plus the forwards it still runs between them)."""
    p = len(fs)
    pre, first_back, _ = _chains(fs, bs, es, lats, spans, b)
    waits = _drain_waits(fs, bs, ws, es, lats, spans, b, held)
    out = []
    for k in range(p):
        n = min(spans[k], b)
        back = bs[k] + ws[k]  # a whole backward (weight pass included)
        first = first_back[k] - bs[k]  # the first backward's earliest start
        last_fwd = pre[k] + fs[k] + (b - 1) * max(fs[:k + 1] + es[:k])  # forward b - 1 ends
        # what stage k runs between forward b - 1 and its last backward: n_k - 1 backwards and the weight
        # passes after those from backward held[k] on (held-back ones run only after the last backward)
        cover = (n - 1) * bs[k] + max(0, b - 1 - max(b - n, held[k])) * ws[k]
        if b > n:  # forward b - 1 comes after the first backward: the two waits are apart
            seq = first + (b - n) * fs[k]
            out.append((seq + b * back + waits[k] - cover, seq))
        else:  # every forward before the first backward
            out.append((max(first, last_fwd + waits[k] - cover) + b * back, first))
    return out


def stage_bound(fs: list[float], bs: list[float], ws: list[float], es: list[float], lats: list[float],
                spans: list[int], b: int, held: list[int]) -> tuple[float, str]:
    """Stage k's own timeline (stage_ends) less the weight passes it runs after its last backward (held[k]
    and the one of that backward, which have no other inputs and so follow it at once), then that
    backward's gradient's way down to stage 0 (post_k). Or its last n_k backwards (the drain, one after
    another) down to stage 0 as a flow shop: backward b - n_k's way down plus n_k - 1 times the slowest
    stage or link below, where a slow link queues the drain's gradients."""
    _, _, post = _chains(fs, bs, es, lats, spans, b)
    best, where = -math.inf, ""
    for k, (t, seq) in enumerate(_timelines(fs, bs, ws, es, lats, spans, b, held)):
        t += post[k] - min(held[k] + 1, b) * ws[k]
        q = min(spans[k], b) - 1
        if k and q:  # backward b - 1 - q ends after b - q backwards and the weight passes between them
            drain = seq + (b - q) * bs[k] + max(0, b - 1 - q - held[k]) * ws[k]
            t = max(t, drain + post[k] + q * max(bs[:k] + es[:k]))
        if t > best:
            best, where = t, f"stage {k}"
    return best, where


def _round_trip_chains(fs: list[float], bs: list[float], ws: list[float], es: list[float], lats: list[float],
                       spans: list[int], b: int, held: list[int]) -> list[tuple[int, float, Label]]:
    """The round trips' chains, each as (stage i, when its last backward can end at the earliest, the
    chain's name); round_trip_bound adds the way down to stage 0. Stage k runs forward y + n_k right after
    backward y, and stage j its backward y + n_k - n_j + 1 right after forward y + n_k, so from stage k's
    backward y to its backward y + d (d = n_k - n_j + 1) runs a cycle of stage k's forward and backward,
    the passes of k+1..j and every link between both ways. Such a cycle exists only while forward y + n_k
    does (y + n_k <= b - 1): N = (b - n_j) // d of them from the first backward. Their backward legs pass
    every stage and link of k..j, so the backwards after them follow one another at the pace of one of
    those: a link's transfer, or a stage's backward plus what that stage runs in between (its next forward
    while there is one, its held-back weight pass). Where a slow link sits next to fast stages the cycles,
    not the link's bandwidth, set the pace. Or, after m <= N cycles, stage k's next forward leaves for a
    stage i beyond k (in the cycle's run or past it), whose own alternation and drain follow: the slow
    link's cycles first, then the later stage's pace (one chain, where the other chains take one pace).
    Each chain also has a variant that ends with its last stage's drain going down as a flow shop
    (stage_bound), given as stage 0's."""
    p = len(fs)
    _, first_back, post = _chains(fs, bs, es, lats, spans, b)
    out: list[tuple[int, float, Label]] = []
    add = out.append  # a list, not a generator: O(p^3) chains, and most of a long plan's full estimate

    # stage i from the end of its backward lo to the end of backward b - 1 (steps(i, lo) below): each backward,
    # plus its next forward while one is left (y + n_i <= b - 1) and its weight pass from backward held[i] on;
    # max(0, v) written as a comparison, the same integers
    last_fwd = [min(b - 1 - sp, b - 2) for sp in spans]

    def steps(i: int, lo: int, hi: int = b - 1) -> float:
        n = hi - lo if hi > lo else 0
        f = (min(b - 1 - spans[i], hi - 1) if hi < b - 1 else last_fwd[i]) - lo + 1
        w = hi - (lo if lo > held[i] else held[i])
        return n * bs[i] + (f if f > 0 else 0) * fs[i] + (w if w > 0 else 0) * ws[i]

    # a stage's drain (its last n_k backwards, one after another) goes down as a flow shop: from backward
    # b - n_k, the first one's way plus n_k - 1 times the slowest stage or link below (stage_bound)
    below = [max(bs[:i] + es[:i]) if i else 0.0 for i in range(p)]

    hop = [e + x for e, x in zip(es, lats)]
    reach = [0.0]  # a forward's compute and hops from stage 0's forward to stage i's
    for i in range(1, p):
        reach.append(reach[-1] + hop[i - 1] + fs[i])

    waits = _drain_waits(fs, bs, ws, es, lats, spans, b, held)
    flight = [min(sp, b) for sp in spans]  # n_i
    fb = [f + x for f, x in zip(fs, bs)]
    drain_down = [(n - 1) * below[i] for i, n in enumerate(flight)]

    # A stage i reached by stage k's forward x (x >= n_i - 1) runs to the end of its last backward: it
    # alternates its backward x - n_i + 1 (and a weight pass from backward held[i] on) with forwards up to
    # b - 1, then drains n_i backwards, the last one after the round trip of forward b - 1 through the later
    # stages (waits[i]): "tail". Or, from backward b - n_i (right after forward b - 1), its drain goes down
    # to stage 0's last backward as a flow shop: "tail down". Both start with the same alternation term.
    for k in range(p - 1):
        if b <= spans[k]:
            continue
        cycle = fs[k] + bs[k]
        for j in range(k + 1, p):
            cycle += fs[j] + bs[j] + 2 * (es[j - 1] + lats[j - 1])
            d = spans[k] - spans[j] + 1
            n = (b - spans[j]) // d
            # a cycle from backward y runs stage k's weight pass of y (if any) before the next forward
            t = first_back[k] + n * cycle + max(0, n - -(-held[k] // d)) * ws[k]  # cycles i with i d >= held
            # after the cycles, backwards n d + 1 .. b - 1 one by one through one stage or link of k..j (the
            # last cycle's backward leg passes them all; without a cycle, only stage k's own steps count)
            lo = n * d
            paced = range(k, j + 1) if n else range(k, k + 1)
            pace = max([steps(i, lo) for i in paced] + [max(0, b - 1 - lo) * e for e in es[k:j] if n])
            t += pace
            add((k, t, (k, j, -1, False)))
            q = min(spans[k], b) - 1  # or stage k's own steps up to its drain, whose flow shop goes down
            if k and q and b - 1 - q > lo:
                t -= pace
                add((0, t + steps(k, lo, b - 1 - q) + q * below[k] + post[k], (k, j, -1, True)))
            # or after m <= n cycles stage k's next forward y = m d + n_k leaves the cycle for a stage i
            # beyond k, whose own steps and drain follow (a slow link's cycles, then the later stages'
            # pace); linear in m but for the weight passes' kinks, so the ends and the kinks suffice
            top = min(n, (b - 1 - spans[k]) // d)
            kinks = {0, top} | {min(top, max(0, (held[i] + spans[i] - 1 - spans[k]) // d + e))
                                for i in range(k + 1, p) for e in (0, 1) if ws[i]}
            for m in kinks:
                if m == 0 and j > k + 1:  # no cycle: the same chain for every j
                    continue
                x = m * d + spans[k]
                if x > b - 1:  # out of every stage's range: no chain
                    continue
                lead = first_back[k] + m * cycle + max(0, m - -(-held[k] // d)) * ws[k]
                lead += (ws[k] if m * d >= held[k] else 0.0) + fs[k] - reach[k]
                after = b - 1 - x
                for i in range(k + 1, p):
                    # tail and tail down (above) written out, not called: O(p^3) of them make most of a long
                    # plan's estimate. Where x is out of stage i's range neither exists (-inf, which no
                    # reader takes): not added
                    ni = flight[i]
                    if x < ni - 1:
                        continue
                    alt = after * fb[i]
                    if ws[i]:  # its weight passes from backward held[i] on (none where none are deferred)
                        h = x - ni + 1
                        if held[i] > h:
                            h = held[i]
                        if b - ni - h > 0:
                            alt += (b - ni - h) * ws[i]
                    at = lead + reach[i]
                    add((i, at + (alt + waits[i] + bs[i]), (k, j, i, False)))
                    add((0, at + (alt + bs[i] + drain_down[i] + post[i]), (k, j, i, True)))
    return out


def _round_trip_list(fs: list[float], bs: list[float], ws: list[float], es: list[float], lats: list[float],
                     spans: list[int], b: int, held: list[int]) -> list[tuple[int, float, Label]]:
    """_round_trip_chains as a list, built once for the two readers of one estimate (round_trip_bound and
    last_backward_ends take the same arguments from CostModel.evaluate): O(p^3) chains, most of a long
    plan's full estimate (Exp-A-1's 36-stage runner-up, 128 micro-batches: ~0.1 s each)."""
    return _round_trip_cached(tuple(fs), tuple(bs), tuple(ws), tuple(es), tuple(lats), tuple(spans), b, tuple(held))


@lru_cache(maxsize=2)
def _round_trip_cached(fs: tuple[float, ...], bs: tuple[float, ...], ws: tuple[float, ...], es: tuple[float, ...],
                       lats: tuple[float, ...], spans: tuple[int, ...], b: int,
                       held: tuple[int, ...]) -> list[tuple[int, float, Label]]:
    return _round_trip_chains(list(fs), list(bs), list(ws), list(es), list(lats), list(spans), b, list(held))


def _chain_name(label: Label) -> str:
    k, j, i, drain = label
    return f"round trip {k}->{j}" + (f", then stage {i}" if i >= 0 else "") + (", drain" if drain else "")


def round_trip_bound(fs: list[float], bs: list[float], ws: list[float], es: list[float], lats: list[float],
                     spans: list[int], b: int, held: list[int]) -> tuple[float, str]:
    """The longest round-trip chain (_round_trip_chains) to stage 0's last backward."""
    _, _, post = _chains(fs, bs, es, lats, spans, b)
    best, where = -math.inf, (0, 0, -1, False)
    for i, t, label in _round_trip_list(fs, bs, ws, es, lats, spans, b, held):
        if t + post[i] > best:
            best, where = t + post[i], label
    return best, _chain_name(where) if best > -math.inf else ""


def backward_ends(fs: list[float], bs: list[float], ws: list[float], es: list[float], lats: list[float],
                  spans: list[int], b: int, held: list[int]) -> list[list[float]]:
    """Per stage k and backward y, when that backward can end at the earliest: after stage k's backward
    y - 1 and what it runs in between (its next forward while one is left, its weight pass from backward
    held[k] on), or after backward y of stage k + 1, its gradient's hop and stage k's backward. Backward 0
    ends no earlier than its round trip or warm-up allow (_chains' first_back). The second chain is what
    stage_bound misses where a stage that holds weight passes back idles waiting for gradients: it cannot
    fill the wait with them, so they all follow the late gradient (ZB-H1, up to 7% low before)."""
    p = len(fs)
    _, first_back, _ = _chains(fs, bs, es, lats, spans, b)
    out = [[-math.inf] * b for _ in range(p)]
    for k in reversed(range(p)):
        n = min(spans[k], b)
        for y in range(b):
            if y == 0:
                t = first_back[k]
            else:  # between backwards y - 1 and y: forward y - 1 + n_k, weight pass of y - 1 - held[k]
                t = (out[k][y - 1] + bs[k] + (fs[k] if y - 1 + n <= b - 1 else 0.0)
                     + (ws[k] if y - 1 >= held[k] else 0.0))
            if k < p - 1:
                t = max(t, out[k + 1][y] + es[k] + lats[k] + bs[k])
            out[k][y] = t
    return out


def last_backward_ends(fs: list[float], bs: list[float], ws: list[float], es: list[float], lats: list[float],
                       spans: list[int], b: int, held: list[int], known: list[float] | None = None) -> list[float]:
    """Per stage k, when its last backward can end at the earliest: its own timeline less the weight passes
    that follow that backward (stage_ends), a round-trip chain that reaches it, `known` (other chains'
    values), or stage k + 1's last backward, its gradient's hop and stage k's backward. A stage's update
    follows its own end, so where stages end at different times (deferred weight passes) the update term
    takes these, not stage 0's end alone."""
    p = len(fs)
    out = [t - min(h + 1, b) * w for t, h, w in zip(stage_ends(fs, bs, ws, es, lats, spans, b, held), held, ws)]
    for i, t, _ in _round_trip_list(fs, bs, ws, es, lats, spans, b, held):
        out[i] = max(out[i], t)
    out = [max(x, ends[-1]) for x, ends in zip(out, backward_ends(fs, bs, ws, es, lats, spans, b, held))]
    if known is not None:
        out = [max(x, y) for x, y in zip(out, known)]
    for k in reversed(range(p - 1)):
        out[k] = max(out[k], out[k + 1] + es[k] + lats[k] + bs[k])
    return out
