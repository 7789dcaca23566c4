"""Human-readable plan tables and explanations."""
from __future__ import annotations

from ..plan import Plan
from .candidates import SearchResult


def table(plan: Plan) -> str:
    rows = [f"{'stage':>5} {'chip':>6} {'TP':>3} {'DP':>4} {'layers':>9} {'recomp':>6} {'time/mb s':>10} {'mem GB':>8}"]
    for i, s in enumerate(plan.stages):
        rng = f"{s.first_layer}-{s.first_layer + s.layers - 1}"
        rows.append(
            f"{i:>5} {s.chip:>6} {s.tp:>3} {plan.dp:>4} {s.layers:>3} {rng:>5} {'yes' if s.recompute else 'no':>6} "
            f"{(s.est_time_s or 0):>10.4f} {(s.est_memory_gb or 0):>8.2f}"
        )
    rows.append(f"dp={plan.dp} micro-batches={plan.micro_batches} x {plan.micro_batch_size} schedule={plan.schedule} "
                f"chips={plan.chips_used()}")
    model = plan.extra.get("model_estimate_s")
    rows.append(f"simulated iteration time {plan.iteration_time_s:.4f} s"
                + (f" (cost model {model:.4f} s)" if model is not None else "")
                + f"; search time {plan.search_time_s:.3f} s")
    return "\n".join(rows)


def explain(plan: Plan, result: SearchResult) -> str:
    ex = plan.extra
    lines = [f"bottleneck: {ex.get('bottleneck')} (fill and drain add {ex.get('fill_drain_s', 0):.4f} s)"]
    caps = ex.get("memory_capacity_gb", [])
    for i, (s, cap) in enumerate(zip(plan.stages, caps)):
        lines.append(
            f"  stage {i}: {s.est_memory_gb:.2f} of {cap:.2f} GB usable, headroom {cap - s.est_memory_gb:.2f} GB, "
            f"holds {ex['in_flight'][i]} micro-batches"
        )
    for i, e in enumerate(ex.get("boundary_s", [])):
        lines.append(f"  boundary {i}->{i + 1}: {e * 1e3:.2f} ms per activation")
    if result.runners_up:
        lines.append("runners-up:")
        for c in result.runners_up:
            desc = ", ".join(f"{s.chip}/tp{s.tp}x{s.layers}{'r' if s.recompute else ''}" for s in c.stages)
            lines.append(f"  {c.time_s:.4f} s  {c.label}: {desc}")
    lines.append(f"search: {result.evaluated} configurations split exactly, {result.pruned} pruned by bounds")
    return "\n".join(lines)
