"""Pipeline schedules as action lists (F, B, I, W, SEND_*, RECV_*), shared by the engine and the simulator."""
from .actions import Action, Schedule, ScheduleError, validate, with_comms
from .generators import build, gpipe, one_f_one_b, zb_h1

__all__ = ["Action", "Schedule", "ScheduleError", "validate", "with_comms", "build", "gpipe", "one_f_one_b", "zb_h1"]
