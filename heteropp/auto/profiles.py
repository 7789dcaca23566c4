"""Profile format: per chip type and TP size, per-layer times and memory for one micro-batch.

Times in seconds for one micro-batch through one decoder layer on one chip of a TP group (TP communication
included); memory in bytes per chip. `wgrad_s` is the weight-gradient share of `bwd_s` (what ZB-H1 defers).
`optim_s` is the optimizer step for one layer's shard when it is not sharded over data parallelism.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
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


# what a profile's numbers were measured on: each must be the problem's for its times to price it
_MEASURED_ON = ("micro_batch_size", "seq_len", "layer_params", "embed_params", "head_params")


def merged(loaded: list[tuple[str, Profile]]) -> Profile:
    """One profile from files that each hold other chip types of one model, sequence length and micro-batch
    size (`heteroauto profile --chip NAME`, run on each type's machine); `loaded`: (source, profile) pairs."""
    (first_src, first), rest = loaded[0], loaded[1:]
    chips = dict(first.chips)
    for src, p in rest:
        for name in _MEASURED_ON:
            if getattr(p, name) != getattr(first, name):
                raise SpecError(src, name, f"{getattr(p, name)}, while {first_src} has {getattr(first, name)}",
                                "profiles of one model, sequence length and micro-batch size (one file per chip "
                                "type); profiles of several micro-batch sizes only with --micro-batch-sizes")
        again = sorted(set(p.chips) & set(chips))
        if again:
            raise SpecError(src, "chips", f"chip type {again[0]!r} is also in another profile",
                            "each chip type in one profile")
        chips.update(p.chips)
    return replace(first, chips=chips)


def check_fits(prof: Profile, source: str, cluster: Any, model: Any, train: Any, measured_on: bool = True) -> None:
    """A profile prices a problem only when it was measured on its model, sequence length and micro-batch size
    (`measured_on`: checked; off for profiles set by hand, which name no such facts) and holds every chip
    type at every TP size the planner may give it (a missing entry raised a KeyError traceback mid-search;
    another model's or length's times gave a plan for the wrong job, silently)."""
    from .space import usable_tp_sizes
    want = {"micro_batch_size": train.micro_batch_size, "seq_len": model.seq_len, "layer_params": model.layer_params,
            "embed_params": model.embed_params, "head_params": model.head_params}
    hint = {"micro_batch_size": "heteroauto profile --micro-batch-size", "seq_len": "heteroauto profile --seq-len, "
            "or --seq-len here"}
    for name in _MEASURED_ON if measured_on else ():
        if getattr(prof, name) != want[name]:
            raise SpecError(source, name, f"the profile was measured with {name} {getattr(prof, name)}, the problem "
                            f"has {want[name]}", f"a profile of this model, sequence length and micro-batch size ("
                            f"{hint.get(name, 'heteroauto profile --model with the same model')})")
    for c in cluster.chips:
        need = usable_tp_sizes(c, model)
        have = sorted(prof.chips[c.name].tp) if c.name in prof.chips else []
        missing = [t for t in need if t not in have]
        if missing:
            held = ", ".join(f"{n} (TP {', '.join(map(str, sorted(p.tp)))})" for n, p in prof.chips.items())
            sizes = f"size{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))}"
            raise SpecError(source, "chips", f"no entry for chip type {c.name!r} at TP {sizes}; it holds "
                            f"{held or 'none'}",
                            f"every chip type of the cluster at the TP sizes the planner may use ("
                            f"heteroauto profile --chip {c.name} --tp {','.join(map(str, need))}, one file per chip "
                            f"type; or a lower tp_max in the cluster spec)")
