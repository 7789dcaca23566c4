"""Learning-rate schedule: linear warm-up, then constant, linear or cosine decay to `min_lr` (Megatron's)."""
from __future__ import annotations

import math
from dataclasses import dataclass

DECAYS = ("constant", "linear", "cosine")


@dataclass(frozen=True)
class LRSchedule:
    lr: float
    warmup_steps: int = 0
    decay: str = "constant"
    total_steps: int = 1  # the step where decay reaches min_lr
    min_lr: float = 0.0

    def __post_init__(self) -> None:
        if self.decay not in DECAYS:
            raise ValueError(f"lr decay {self.decay!r} is not one of {', '.join(DECAYS)}")
        if self.warmup_steps < 0 or self.min_lr < 0 or self.min_lr > self.lr:
            raise ValueError(f"warmup_steps >= 0 and 0 <= min_lr <= lr expected, got {self.warmup_steps}, "
                             f"{self.min_lr}, {self.lr}")

    def at(self, step: int) -> float:
        """The learning rate of optimizer step `step` (counted from 1)."""
        if step <= self.warmup_steps:
            return self.lr * step / self.warmup_steps
        if self.decay == "constant":
            return self.lr
        span = max(1, self.total_steps - self.warmup_steps)
        frac = min(1.0, (step - self.warmup_steps) / span)
        if self.decay == "linear":
            return self.lr - (self.lr - self.min_lr) * frac
        return self.min_lr + (self.lr - self.min_lr) * 0.5 * (1 + math.cos(math.pi * frac))
