"""Pipeline schedules as action lists (F, B, I, W, SEND_*, RECV_*), shared by the engine and the simulator."""
from .actions import Action, Op, Schedule, ScheduleError, validate, with_comms
from .generators import gpipe, h_1f1b, one_f_one_b, zb_h1
from .registry import (NAMES, REGISTRY, ScheduleKind, build, h1f1b_extra, harp_launch_extra, kind, missing_params,
                       params_error)

__all__ = ["Action", "Op", "Schedule", "ScheduleError", "validate", "with_comms", "build", "gpipe", "h_1f1b",
           "one_f_one_b", "zb_h1", "NAMES", "REGISTRY", "ScheduleKind", "h1f1b_extra", "harp_launch_extra", "kind",
           "missing_params", "params_error"]
