"""Turn a schedule name or a hand-written action list into validated per-stage action lists with comms."""
from __future__ import annotations

from ..plan import Plan
from ..schedules import Action, Schedule, ScheduleError, build, missing_params, params_error, validate, with_comms


def compile_schedule(plan: Plan, schedule: str | list[list[str]]) -> Schedule:
    """`schedule`: a registered name (its parameters from the plan), or compute actions per stage
    (e.g. [["F0", "F1", "B0", "B1"], ...]).
    Raises ScheduleError for a malformed or deadlocking list, before any process runs it."""
    p, m = plan.devices, plan.micro_batches
    if isinstance(schedule, str):
        params = plan.schedule_params if schedule == plan.schedule else {}
        missing = missing_params(schedule, params)
        if missing:
            raise ScheduleError(f"schedule {schedule!r} needs schedule_params.{missing[0]} in the plan "
                                f"(`heteroauto simulate --schedule {schedule}` derives it)")
        if (why := params_error(schedule, params, p)) is not None:
            raise ScheduleError(why)
        sched = build(schedule, p, m, params)
    else:
        if len(schedule) != p:
            raise ScheduleError(f"action list has {len(schedule)} stages; the plan has {p}")
        try:
            sched = [[Action.parse(a) for a in stage] for stage in schedule]
        except ValueError as e:
            raise ScheduleError(str(e)) from None
        bad = [f"stage {s}: {a}" for s, acts in enumerate(sched) for a in acts if a.op.startswith(("SEND", "RECV"))]
        if bad:
            raise ScheduleError(f"give compute actions only (sends and receives are inserted): {bad[0]}")
    full = with_comms(sched)
    validate(full, m)
    return full
