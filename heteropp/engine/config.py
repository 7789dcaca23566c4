"""Typed configuration of one training run, shared by the launcher, the workers and the reference."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from ..plan import Plan
from ..spec import ModelSpec
from .straggler import THRESHOLD as STRAGGLER_THRESHOLD

DEFAULT_RECV_WINDOW = 4
COMPUTE_DTYPES = ("fp32", "bf16", "fp16")


@dataclass
class TrainOptions:
    """What a real run adds to the plan: the weights it starts from, its data, precision, optimizer schedule and
    checkpoints. Shared by the engine's workers and the single-process reference."""
    dtype: str = "fp32"  # parameters and activations; fp32 master weights and optimizer state otherwise
    weight_decay: float = 0.01  # not applied to norms and biases
    zero1: bool = True  # shard the optimizer state over each DP group (False: every DP rank holds it whole)
    warmup_steps: int = 0
    lr_decay: str = "constant"  # constant, linear or cosine (to min_lr at the run's last step)
    min_lr: float = 0.0
    init_from: str | None = None  # HF model directory whose safetensors weights the run starts from
    data: str | None = None  # token file (`heteropp data prepare`); None: synthetic tokens
    checkpoint_dir: str | None = None
    save_every: int = 0  # steps between checkpoints (0: only at the end when checkpoint_dir is set)
    resume: bool = False  # continue from the newest complete checkpoint in checkpoint_dir
    reset_optimizer: bool = False  # on resume, take the weights only: Adam's moments and step start afresh
    keep_checkpoints: int = 2  # complete checkpoints kept (older ones are deleted after a newer one completes)
    async_save: bool = True  # checkpoints are written by a background thread while training goes on
    hf_config: dict[str, Any] | None = None  # the model's own config.json (when it came from one): export keeps it
    peak_flops: float | None = None  # summed peak FLOP/s of the plan's chips (the cluster spec's): the MFU's base
    # a stage is reported a straggler when this many times slower than the others (straggler.py); raise it where
    # the chips' speed varies on its own (shared hosts)
    straggler_threshold: float = STRAGGLER_THRESHOLD

    def __post_init__(self) -> None:
        if not (math.isfinite(self.straggler_threshold) and self.straggler_threshold > 1):
            raise ValueError(f"straggler_threshold must be a finite number > 1 (times slower than the other stages), "
                             f"got {self.straggler_threshold!r}")
        if self.dtype not in COMPUTE_DTYPES:
            raise ValueError(f"dtype {self.dtype!r} is not one of {', '.join(COMPUTE_DTYPES)}")


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
    fail_rank: int = -1  # this rank raises at step `fail_step` (failure tests)
    fail_step: int = 1
    fail_kill: bool = False  # the failing rank SIGKILLs itself instead of raising
    slow_rank: int = -1  # tests: this rank's compute actions each take `slow_s` longer (a slowed chip)
    slow_s: float = 0.0
    verbose: bool = False
    options: dict[str, Any] = field(default_factory=dict)  # TrainOptions fields
    # dicomm's DICOMM_JOB_SECRET for the ranks of this job (set by the launcher; never written to a file)
    job_secret: str | None = None
    # [chip type, chips] per torchrun node in node-rank order: a worker takes the plan rank the node rule puts on
    # its node and local rank (node_ranks.py); None: torchrun's RANK
    nodes: list[list[Any]] | None = None
    # chip type -> the cluster spec's device_name pattern: a host that does not say its chip type is matched to
    # the nodes of the type its device's name fits (device_match.py)
    device_names: dict[str, str] = field(default_factory=dict)

    @property
    def opts(self) -> TrainOptions:
        return TrainOptions(**self.options)

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
