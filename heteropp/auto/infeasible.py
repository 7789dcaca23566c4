"""Why no plan exists: the first cause that rules out every data-parallel size, checked in a fixed order
(too many stages for the layers, too little memory for the layers, no chip type that holds the embedding
or the head), so the message names the cause and not a symptom of another."""
from __future__ import annotations

from .costs import CostModel
from .space import dp_candidates, tp_counts, tp_sizes


def _type_options(cm: CostModel, dp: int) -> dict[str, list[tuple[int, int]]]:
    """Per chip type at data-parallel size dp: (tp, stages) for every TP size its per-replica chips split into."""
    counts = tp_counts(cm.model)
    out = {}
    for c in cm.cluster.chips:
        per = c.count // dp
        out[c.name] = [(t, per // t) for t in tp_sizes(c, *counts) if per % t == 0] if c.count % dp == 0 else []
    return out


def explain_infeasible(cm: CostModel, idle: bool = False) -> str:
    """The reason, with the numbers behind it, that no plan fits (dp_candidates raises its own); with
    `idle` (chips may stay idle) the stage count is no cause."""
    L, name = cm.model.layers, cm.model.name
    head = f"no plan fits the {L}-layer model {name!r} on cluster {cm.cluster.name!r}: "
    usable = "; ".join(f"{c.name}: {c.memory_gb:g} GB x {c.memory_fraction:g} usable" for c in cm.cluster.chips)
    dps = dp_candidates(cm.cluster, cm.train)
    options = {dp: _type_options(cm, dp) for dp in dps}
    unsplit = {dp: [n for n, o in opts.items() if not o] for dp, opts in options.items()}
    if all(unsplit.values()):
        dp = dps[0]
        return head + (f"at dp={dp} the {unsplit[dp][0]!r} chips split into no whole stages of any TP size the "
                       f"model allows (the TP rule: heads, kv_heads, ffn and vocab)")
    fewest = {dp: sum(min(s for _, s in o) for o in opts.values()) for dp, opts in options.items() if not unsplit[dp]}
    if min(fewest.values()) > L and not idle:
        dp = min(fewest, key=lambda d: fewest[d])
        return head + (f"every chip serves in a stage and every stage holds at least one layer, but the fewest "
                       f"stages any data-parallel size allows is {fewest[dp]} (dp={dp}, each type at its largest "
                       f"TP size), more than the {L} layers")
    most = {dp: sum(max(s * cm.max_layers(n, t, True, dp, 1, False, False) for t, s in o) for n, o in opts.items())
            for dp, opts in options.items() if not unsplit[dp]}
    if max(most.values()) < L:
        dp = max(most, key=lambda d: most[d])
        return head + (f"memory: even with recompute and one micro-batch in flight the chips hold at most "
                       f"{most[dp]} layers (dp={dp}), fewer than the {L} layers ({usable})")
    for which, first in (("embedding", True), ("output head", False)):
        if not any(cm.max_layers(n, t, True, dp, 1, first, not first) >= 1
                   for dp, opts in options.items() for n, o in opts.items() for t, _ in o):
            return head + (f"memory: no chip type holds the {which} next to one layer (the "
                           f"{'first' if first else 'last'} stage holds it)")
    return head + (f"memory: the layers fit one micro-batch at a time, but no split holds the micro-batches "
                   f"the {cm.train.schedule} schedule keeps in flight on every stage ({usable})")
