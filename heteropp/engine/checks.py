"""Everything checked before a single process starts: the plan against the model, the world size, chip
types, and the schedule's action lists."""
from __future__ import annotations

from ..plan import Plan
from ..spec import ModelSpec, SpecError
from .schedule import compile_schedule
from .topology import resolve_chip


def check_run(plan: Plan, m: ModelSpec, source: str, chip_map: dict[str, str], schedules: list,
              world_size: int | None = None, available: dict[str, int] | None = None,
              nodes: dict[str, tuple[int, ...]] | None = None) -> None:
    """Raise SpecError (or ScheduleError) naming the field, stage or schedule that cannot run; `available`
    (chips per type of the cluster given) bounds the chips the plan may use, `nodes` (each type's node
    sizes) its TP groups (spec/placement.py: a TP group never spans nodes)."""
    # Every stage's TP size is checked here by the shared rule (tp_split_error), the one StageModel applies.
    plan.validate(source, num_layers=m.layers, heads=m.heads, kv_heads=m.kv_heads, ffn=m.ffn, vocab=m.vocab,
                  world_size=world_size, available=available, nodes=nodes)
    for name, s in plan.stage_names():
        try:
            resolve_chip(s.chip, chip_map)
        except ValueError as e:
            raise SpecError(source, f"{name}.chip", str(e), "a chip type ditorch knows") from None
    for sched in schedules:
        for group in plan.groups:
            compile_schedule(group, sched)
