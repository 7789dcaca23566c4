"""Typed configuration of one training run, shared by the launcher, the workers and the reference."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..plan import Plan
from ..spec import ModelSpec

DEFAULT_RECV_WINDOW = 4


@dataclass
class RunConfig:
    plan: dict[str, Any]  # Plan.to_dict(); a dict so the config pickles and prints plainly
    model: dict[str, Any]  # ModelSpec fields
    steps: int = 10
    seed: int = 0
    lr: float = 3e-3
    # Empty: the plan's own. Several: one training run each. A list of lists: hand-written compute actions.
    schedules: list[str | list[list[str]]] = field(default_factory=list)
    backend: str = "dicomm"  # point-to-point between stages: dicomm or gloo
    chip_map: dict[str, str] = field(default_factory=dict)  # plan chip name -> ditorch vendor / device name
    loss_log: str | None = None
    timeout_s: float = 60.0  # every collective, send and receive fails after this long
    clip_grad: float | None = None  # clip gradients to this global L2 norm (None: no clipping)
    # receives posted ahead of the one awaited (bounds a stage's receive buffers)
    recv_window: int = DEFAULT_RECV_WINDOW
    # Tests: compare against the reference beyond the loss. Off by default; each copy costs one model's memory.
    collect_grads: bool = False  # workers return every step's gradients: a list, one {name: shard} per step
    collect_params: bool = False  # workers return their parameters after the last optimizer step
    fail_rank: int = -1  # this rank raises at step 1 (failure tests)
    verbose: bool = False

    @property
    def plan_obj(self) -> Plan:
        return Plan.from_dict(self.plan)

    @property
    def model_spec(self) -> ModelSpec:
        return ModelSpec(**self.model)

    def schedule_list(self) -> list[str | list[list[str]]]:
        return self.schedules or [self.plan["schedule"]]

    @staticmethod
    def model_dict(m: ModelSpec) -> dict[str, Any]:
        return asdict(m)
