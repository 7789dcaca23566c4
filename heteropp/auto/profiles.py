"""Profile format: per chip type and TP size, per-layer times and memory for one micro-batch.

Times in seconds for one micro-batch through one decoder layer on one chip of a TP group (TP communication
included); memory in bytes per chip. `wgrad_s` is the weight-gradient share of `bwd_s` (what ZB-H1 defers).
`optim_s` is the optimizer step for one layer's shard when it is not sharded over data parallelism.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..spec.errors import SpecError


@dataclass(frozen=True)
class TPProfile:
    fwd_s: float
    bwd_s: float
    recompute_s: float
    wgrad_s: float
    act_bytes: float  # saved for backward per micro-batch, recompute off
    ckpt_bytes: float  # saved per micro-batch with recompute on (the layer input)
    optim_s: float
    embed_s: float = 0.0  # embedding forward+backward
    head_s: float = 0.0  # final norm + output head + loss forward+backward
    head_act_bytes: float = 0.0  # logits and their fp32 softmax, transient on the last stage


@dataclass(frozen=True)
class ChipProfile:
    tp: dict[int, TPProfile]


@dataclass
class Profile:
    model: str
    micro_batch_size: int
    seq_len: int
    layer_params: int
    embed_params: int
    head_params: int
    chips: dict[str, ChipProfile]
    source: str = "analytic"
    meta: dict[str, Any] = field(default_factory=dict)

    def get(self, chip: str, tp: int) -> TPProfile:
        try:
            return self.chips[chip].tp[tp]
        except KeyError:
            have = {c: sorted(p.tp) for c, p in self.chips.items()}
            raise KeyError(f"profile has no entry for chip {chip!r} at tp={tp}; it has {have}") from None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["chips"] = {c: {"tp": {str(t): asdict(p) for t, p in cp.tp.items()}} for c, cp in self.chips.items()}
        return d

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "<profile>") -> "Profile":
        try:
            chips = {
                c: ChipProfile({int(t): TPProfile(**p) for t, p in v["tp"].items()}) for c, v in d["chips"].items()
            }
            rest = {k: v for k, v in d.items() if k != "chips"}
            return cls(chips=chips, **rest)
        except (KeyError, TypeError, ValueError) as e:
            raise SpecError(
                source, "chips", f"malformed profile: {e}", "the format written by `heteroauto profile`"
            ) from e

    @classmethod
    def load(cls, path: str | Path) -> "Profile":
        try:
            d = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise SpecError(str(path), "<file>", f"cannot read: {e}", "a profile JSON file") from e
        return cls.from_dict(d, str(path))
