"""The one plan schema, shared by HeteroAuto (which writes it) and the HeteroPP engine (which runs it).

A plan lists pipeline stages in order. Each stage is a group of same-type chips with its own tensor-parallel
size, a contiguous range of decoder layers and a recompute flag. Data parallelism has two levels (HetAuto's
d_k = d_outer * d_inner,k): `Plan.dp` independent pipelines, each taking its share of the micro-batches,
and per stage `inner_dp` replicas inside one pipeline that split every micro-batch along the batch
dimension (micro_batch_size / inner_dp sequences each). Stage k so has dp * inner_dp_k replicas of tp_k
ranks; its gradients are reduced over those replicas. Chips of the cluster that no stage uses stay idle.
Stage 0 also holds the embedding, the last stage the final norm and output head. Ranks are assigned stage
by stage: stage k, replica r (= outer replica * inner_dp_k + inner replica), tp rank t -> offset_k + r * tp_k + t.

Under the interleaved schedule each group of chips holds `schedule_params.chunks` model chunks: `stages`
then lists the virtual stages in pipeline order, virtual stage i on the chips of stage i % p (`Plan.chunks`,
`Plan.devices`). Version 2 added `inner_dp`; a plan of another version is rejected with what to do.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from .schedules.registry import NAMES, kind, params_error
from .spec.errors import SpecError
from .spec.placement import PlacementError, StageBlock, place

SCHEDULES = NAMES  # every registered schedule (heteropp/schedules/registry.py)
PLAN_VERSION = 2


def tp_split_error(tp: int, heads: int | None = None, kv_heads: int | None = None, ffn: int | None = None,
                   vocab: int | None = None) -> tuple[str, str] | None:
    """Why `tp` ranks cannot split the model, as (what is wrong, what is expected), or None.

    The one TP rule, shared by plan validation, the planner's search space and the engine's stage model,
    so the planner never proposes a TP size the engine refuses. Query heads, the FFN width and the
    vocabulary are split evenly; key/value heads are split too, or, with more ranks than key/value heads,
    each is replicated on tp // kv_heads consecutive ranks. A count left as None is not checked."""
    if heads is not None and heads % tp:
        return f"tp={tp} does not divide the model's heads={heads}", f"a divisor of {heads}"
    if kv_heads is not None and kv_heads % tp and tp % kv_heads:
        return (f"tp={tp} neither divides nor is a multiple of the model's kv_heads={kv_heads}",
                f"a divisor or a multiple of {kv_heads}")
    for name, n in (("ffn", ffn), ("vocab", vocab)):
        if n is not None and n % tp:
            return f"tp={tp} does not divide the model's {name}={n}", f"a divisor of {n}"
    return None


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass
class StagePlan:
    chip: str
    tp: int
    layers: int  # number of decoder layers
    recompute: bool = False
    first_layer: int = -1  # filled by Plan.__post_init__ when omitted
    est_time_s: float | None = None  # per-micro-batch forward+backward(+recompute) time
    est_memory_gb: float | None = None  # peak memory per chip
    inner_dp: int = 1  # replicas inside one pipeline, each taking micro_batch_size / inner_dp sequences

    @property
    def layer_range(self) -> range:
        return range(self.first_layer, self.first_layer + self.layers)


@dataclass
class Plan:
    stages: list[StagePlan]
    dp: int
    micro_batch_size: int
    micro_batches: int  # per data-parallel replica per iteration
    schedule: str = "1f1b"
    model: str | None = None
    num_layers: int | None = None  # the model's layer count, checked against the stages when given
    iteration_time_s: float | None = None
    search_time_s: float | None = None
    algo: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # free-form estimates (bubble, per-stage detail)
    schedule_params: dict[str, Any] = field(default_factory=dict)  # e.g. h1f1b's extra_warmup per boundary
    version: int = PLAN_VERSION

    def __post_init__(self) -> None:
        first = 0
        for s in self.stages:
            if not (_is_int(s.layers) and _is_int(s.first_layer)):
                break  # malformed: validate() names the field instead of a TypeError here
            if s.first_layer < 0:
                s.first_layer = first
            first = s.first_layer + s.layers

    @property
    def chunks(self) -> int:
        """Model chunks per group of chips: `schedule_params.chunks` under the interleaved schedule, else 1.
        Then `stages` lists the p * chunks virtual stages in pipeline order and virtual stage i runs on the
        chips of stage i % p (the first p entries name them)."""
        if self.schedule not in SCHEDULES or not isinstance(self.schedule_params, dict):
            return 1  # malformed: validate() says so
        return kind(self.schedule).chunks(self.schedule_params)

    @property
    def devices(self) -> int:
        """Groups of chips along the pipeline (stages, or stages / chunks for an interleaved plan)."""
        return max(len(self.stages) // self.chunks, 1)

    def stage_dp(self, k: int) -> int:
        """Replicas of stage k: the pipelines times the stage's inner replicas."""
        return self.dp * self.stages[k].inner_dp

    def stage_ranks(self, k: int) -> int:
        return self.stages[k].tp * self.stage_dp(k)

    @property
    def world_size(self) -> int:
        return sum(self.stage_ranks(k) for k in range(self.devices))

    @property
    def global_batch(self) -> int:
        return self.dp * self.micro_batches * self.micro_batch_size

    def chips_used(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for k, s in enumerate(self.stages[:self.devices]):
            out[s.chip] = out.get(s.chip, 0) + self.stage_ranks(k)
        return out

    def rank_offsets(self) -> list[int]:
        offs, r = [], 0
        for k in range(self.devices):
            offs.append(r)
            r += self.stage_ranks(k)
        return offs

    def validate(self, source: str = "<plan>", *, num_layers: int | None = None, heads: int | None = None,
                 kv_heads: int | None = None, ffn: int | None = None, vocab: int | None = None,
                 world_size: int | None = None, available: Mapping[str, int] | None = None,
                 nodes: Mapping[str, Sequence[int]] | None = None) -> "Plan":
        """Raise SpecError naming the field for anything the engine could not run; the model counts given
        are checked against each stage's TP size by the shared rule (tp_split_error), `available`
        (chips per type of the cluster the plan is for) against the chips the plan uses, and `nodes` (each
        type's node sizes, ChipType.node_sizes) against its TP groups: a TP group never spans nodes."""
        if not self.stages:
            raise SpecError(source, "stages", "empty", "at least one stage")
        for name, v in (
            ("dp", self.dp),
            ("micro_batch_size", self.micro_batch_size),
            ("micro_batches", self.micro_batches),
        ):
            if not _is_int(v) or v < 1:
                raise SpecError(source, name, f"got {v!r}", "an integer >= 1")
        if self.version != PLAN_VERSION:
            raise SpecError(source, "version", f"got {self.version!r}",
                            f"{PLAN_VERSION}: plans of version 1 predate per-stage data parallelism; write them "
                            f"again with `heteroauto plan`, or set version {PLAN_VERSION} (every stage then has "
                            "inner_dp 1, the old meaning)")
        if self.schedule not in SCHEDULES:
            raise SpecError(source, "schedule", f"got {self.schedule!r}", "one of " + ", ".join(SCHEDULES))
        if (why := params_error(self.schedule, self.schedule_params, len(self.stages))) is not None:
            raise SpecError(source, "schedule_params", why, f"the parameters of {self.schedule!r}")
        if len(self.stages) % self.chunks:
            raise SpecError(source, "stages", f"{len(self.stages)} stages for {self.chunks} chunks per group of chips",
                            "a multiple of schedule_params.chunks (the virtual stages in pipeline order)")
        groups = self.devices
        for i in range(groups, len(self.stages)):
            a, b = self.stages[i], self.stages[i % groups]
            if (a.chip, a.tp, a.inner_dp) != (b.chip, b.tp, b.inner_dp):
                raise SpecError(source, f"stages[{i}]", f"runs on the chips of stages[{i % groups}] but names "
                                f"{a.chip}/tp{a.tp}/inner_dp{a.inner_dp}", f"{b.chip}/tp{b.tp}/inner_dp{b.inner_dp}")
        expect = 0
        for i, s in enumerate(self.stages):
            p = f"stages[{i}]"
            if not isinstance(s.chip, str) or not s.chip:
                raise SpecError(source, f"{p}.chip", f"got {s.chip!r}", "a chip type name")
            if not _is_int(s.tp) or s.tp < 1 or s.tp & (s.tp - 1):
                raise SpecError(source, f"{p}.tp", f"got {s.tp!r}", "a power of two >= 1")
            if not _is_int(s.layers) or s.layers < 1:
                raise SpecError(source, f"{p}.layers", f"got {s.layers!r}", "an integer >= 1")
            if not _is_int(s.inner_dp) or s.inner_dp < 1 or self.micro_batch_size % s.inner_dp:
                raise SpecError(source, f"{p}.inner_dp", f"got {s.inner_dp!r}",
                                f"an integer >= 1 dividing micro_batch_size={self.micro_batch_size}")
            if not isinstance(s.recompute, bool):
                raise SpecError(source, f"{p}.recompute", f"got {s.recompute!r}", "true or false")
            if not _is_int(s.first_layer) or s.first_layer != expect:
                raise SpecError(source, f"{p}.first_layer", f"got {s.first_layer}", f"{expect} (layers are contiguous)")
            expect += s.layers
            if (split_why := tp_split_error(s.tp, heads, kv_heads, ffn, vocab)) is not None:
                raise SpecError(source, f"{p}.tp", *split_why)
        total = num_layers if num_layers is not None else self.num_layers
        if total is not None and expect != total:
            raise SpecError(source, "stages[*].layers", f"layers sum to {expect}", f"the model's {total} layers")
        if world_size is not None and self.world_size != world_size:
            raise SpecError(source, "stages[*].tp * dp * inner_dp", f"plan needs {self.world_size} ranks",
                            f"the world size {world_size}")
        if available is not None:
            self._check_chips(source, available)
        if nodes is not None:
            self.placement(nodes, source)
        return self

    def placement(self, nodes: Mapping[str, Sequence[int]], source: str = "<plan>") -> list[list[int]]:
        """Per stage (group of chips), the node of each of its TP groups (spec/placement.py), in replica order;
        SpecError naming the stage whose TP group fits in no node of its type."""
        blocks = [StageBlock(s.chip, s.tp, self.stage_dp(k)) for k, s in enumerate(self.stages[:self.devices])]
        try:
            return place(nodes, blocks)
        except PlacementError as e:
            raise SpecError(source, f"stages[{e.stage}].tp", str(e),
                            "TP groups that fit in the chip type's nodes (a smaller tp, or fewer replicas)") from e

    def _check_chips(self, source: str, available: Mapping[str, int]) -> None:
        for i, s in enumerate(self.stages):
            if s.chip not in available:
                raise SpecError(source, f"stages[{i}].chip", f"chip type {s.chip!r} is not in the cluster",
                                "one of " + ", ".join(available))
        for chip, n in self.chips_used().items():
            if n > available[chip]:
                raise SpecError(source, "stages[*].tp * dp * inner_dp", f"plan uses {n} chips of type {chip!r}",
                                f"at most the cluster's {available[chip]}")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["chips_used"] = self.chips_used()
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "<plan>") -> "Plan":
        if not isinstance(data, dict):
            raise SpecError(source, "<top level>", f"got {type(data).__name__}", "a mapping")
        for key in ("stages", "dp", "micro_batches"):
            if key not in data:
                raise SpecError(source, key, "missing", "a value")
        if not isinstance(data["stages"], list):
            raise SpecError(source, "stages", f"got {type(data['stages']).__name__}", "a list")
        stages = []
        allowed = {f for f in StagePlan.__dataclass_fields__}
        for i, s in enumerate(data["stages"]):
            if not isinstance(s, dict):
                raise SpecError(source, f"stages[{i}]", f"got {type(s).__name__}", "a mapping")
            for k in ("chip", "tp", "layers"):
                if k not in s:
                    raise SpecError(source, f"stages[{i}].{k}", "missing", "a value")
            extra = set(s) - allowed
            if extra:
                raise SpecError(
                    source, f"stages[{i}].{sorted(extra)[0]}", "unknown field", "one of " + ", ".join(sorted(allowed))
                )
            stages.append(StagePlan(**s))
        top = {f for f in cls.__dataclass_fields__} | {"chips_used"}
        extra = set(data) - top
        if extra:
            raise SpecError(source, sorted(extra)[0], "unknown field", "one of " + ", ".join(sorted(top)))
        kw = {k: v for k, v in data.items() if k not in ("stages", "chips_used")}
        kw.setdefault("micro_batch_size", 1)
        plan = cls(stages=stages, **kw).validate(source)
        if "chips_used" in data and data["chips_used"] != plan.chips_used():
            # written by to_dict from the stages: a different value means one of them was edited
            raise SpecError(source, "chips_used", f"got {data['chips_used']!r}",
                            f"the chips the stages use, {plan.chips_used()!r} (or leave the field out)")
        return plan

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "Plan":
        p = Path(path)
        try:
            data = json.loads(p.read_text())
        except FileNotFoundError as e:
            raise SpecError(str(path), "<file>", "file not found", "a plan JSON file") from e
        except json.JSONDecodeError as e:
            raise SpecError(str(path), "<file>", f"cannot parse: {e}", "valid JSON") from e
        return cls.from_dict(data, str(path))
