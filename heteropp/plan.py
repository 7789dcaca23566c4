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

Replicas with different pipelines (HexiScale; HetAuto's outer x inner) are written `replicas`: a list of
groups, each `dp` identical pipelines of its own `stages` taking its own `micro_batches` (the global batch
is their sum times micro_batch_size), in place of the top-level `stages`, `dp` and `micro_batches` (which
then mirror the first group in memory; `Plan.groups` lists every group as a plan of one stage list). A
layer's gradients are reduced over every rank that holds it, in every group, so a layer has the same TP
size in every group. Only schedules without parameters (1f1b, gpipe, zbh1) take such plans.
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
class ReplicaGroup:
    """`dp` identical pipelines of `stages`, each taking `micro_batches` micro-batches per iteration: one
    group of a plan whose replicas run different pipelines (Plan.replicas)."""

    stages: list[StagePlan]
    micro_batches: int
    dp: int = 1


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
    replicas: list[ReplicaGroup] = field(default_factory=list)  # replicas with different pipelines; [] = all alike
    # the training spec's zero1 the plan was priced with; a plan written before the field trained with ZeRO-1
    # (a plan of replica groups written without it: false, as HeteroAuto priced those)
    zero1: bool = True

    @classmethod
    def of_replicas(cls, groups: list[ReplicaGroup], micro_batch_size: int, **kw: Any) -> "Plan":
        """A plan whose replica groups run different pipelines (the top-level fields mirror the first)."""
        g = groups[0]
        kw.setdefault("zero1", False)  # each holder keeps its parts' whole optimizer state unless the plan says
        return cls(stages=g.stages, dp=g.dp, micro_batch_size=micro_batch_size, micro_batches=g.micro_batches,
                   replicas=groups, **kw)

    @property
    def groups(self) -> list["Plan"]:
        """Every replica group as a plan of one stage list (this plan itself when all replicas are alike)."""
        if not self.replicas:
            return [self]
        return [Plan(stages=g.stages, dp=g.dp, micro_batch_size=self.micro_batch_size, micro_batches=g.micro_batches,
                     schedule=self.schedule, model=self.model, num_layers=self.num_layers,
                     schedule_params=self.schedule_params, version=self.version) for g in self.replicas]

    def __post_init__(self) -> None:
        for stages in [self.stages] + [g.stages for g in self.replicas if isinstance(g, ReplicaGroup)]:
            first = 0
            for s in stages:
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
        if self.replicas:
            return sum(g.world_size for g in self.groups)
        return sum(self.stage_ranks(k) for k in range(self.devices))

    @property
    def global_batch(self) -> int:
        if self.replicas:
            return sum(g.global_batch for g in self.groups)
        return self.dp * self.micro_batches * self.micro_batch_size

    def chips_used(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for g in self.groups:
            for k, s in enumerate(g.stages[:g.devices]):
                out[s.chip] = out.get(s.chip, 0) + g.stage_ranks(k)
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
        if not isinstance(self.zero1, bool):
            raise SpecError(source, "zero1", f"got {self.zero1!r}", "true or false (default true: ZeRO-1)")
        if self.replicas:
            return self._validate_groups(source, num_layers, heads, kv_heads, ffn, vocab, world_size, available,
                                         nodes)
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
        return self._check_cluster(source, "stages[*].tp * dp * inner_dp", world_size, available, nodes)

    def _check_cluster(self, source: str, ranks_field: str, world_size: int | None,
                       available: Mapping[str, int] | None, nodes: Mapping[str, Sequence[int]] | None) -> "Plan":
        """The plan against the world size, the cluster's chips per type and their nodes."""
        if world_size is not None and self.world_size != world_size:
            raise SpecError(source, ranks_field, f"plan needs {self.world_size} ranks", f"the world size {world_size}")
        if available is not None:
            self._check_chips(source, available, ranks_field)
        if nodes is not None:
            self.placement(nodes, source)
        return self

    def placement(self, nodes: Mapping[str, Sequence[int]], source: str = "<plan>") -> list[list[int]]:
        """Per stage (group of chips; every replica group's in turn) of a chip type in `nodes`, the node of each
        of its TP groups (spec/placement.py), in replica order; SpecError naming the stage whose TP group fits
        in no node. Stages of other types are left out."""
        names, blocks = [], []
        for i, g in enumerate(self.groups):
            for k, s in enumerate(g.stages[:g.devices]):
                if s.chip not in nodes:
                    continue
                names.append(f"replicas[{i}].stages[{k}]" if self.replicas else f"stages[{k}]")
                blocks.append(StageBlock(s.chip, s.tp, g.stage_dp(k)))
        try:
            return place(nodes, blocks)
        except PlacementError as e:
            raise SpecError(source, f"{names[e.stage]}.tp", str(e).replace(f"stage {e.stage}", names[e.stage]),
                            "TP groups that fit in the chip type's nodes (a smaller tp, or fewer replicas)") from e

    def _validate_groups(self, source: str, num_layers: int | None, heads: int | None, kv_heads: int | None,
                         ffn: int | None, vocab: int | None, world_size: int | None,
                         available: Mapping[str, int] | None, nodes: Mapping[str, Sequence[int]] | None) -> "Plan":
        """validate() of a plan whose replica groups differ: each group as a plan of its own, then what the
        groups share (the schedule, each layer's TP size, the chips and nodes)."""
        if not isinstance(self.replicas, list) or not all(isinstance(g, ReplicaGroup) for g in self.replicas):
            raise SpecError(source, "replicas", f"got {self.replicas!r}", "a list of replica groups")
        if self.schedule in SCHEDULES and kind(self.schedule).params:
            raise SpecError(source, "schedule", f"{self.schedule!r} with replicas that differ",
                            "a schedule without parameters (1f1b, gpipe, zbh1): each group would need its own")
        total = num_layers if num_layers is not None else self.num_layers
        tp_of: dict[int, tuple[int, int]] = {}  # layer -> (tp, the group that set it)
        for i, g in enumerate(self.groups):
            try:
                g.validate(source, num_layers=total, heads=heads, kv_heads=kv_heads, ffn=ffn, vocab=vocab)
            except SpecError as e:
                raise SpecError(source, f"replicas[{i}].{e.field}", e.problem, e.expected) from None
            if total is None and i and sum(s.layers for s in g.stages) != len(tp_of):
                raise SpecError(source, f"replicas[{i}].stages[*].layers", "a different layer count than replicas[0]",
                                "every group holding the whole model")
            for k, s in enumerate(g.stages):
                for layer in s.layer_range:
                    tp, first = tp_of.setdefault(layer, (s.tp, i))
                    if tp != s.tp:
                        raise SpecError(source, f"replicas[{i}].stages[{k}].tp",
                                        f"layer {layer} at tp={s.tp}, but at tp={tp} in replicas[{first}]",
                                        "the same TP size for a layer in every group (its gradients are reduced "
                                        "shard by shard over every rank that holds it)")
        g0 = self.replicas[0]
        if (self.stages, self.dp, self.micro_batches) != (g0.stages, g0.dp, g0.micro_batches):
            raise SpecError(source, "stages", "differs from replicas[0]", "the first group's stages, dp and "
                            "micro_batches (or only `replicas`)")
        return self._check_cluster(source, "replicas[*].stages[*].tp * dp * inner_dp", world_size, available, nodes)

    def stage_names(self) -> list[tuple[str, StagePlan]]:
        """Every stage of every replica group with the field that names it in the plan file."""
        if not self.replicas:
            return [(f"stages[{k}]", s) for k, s in enumerate(self.stages)]
        return [(f"replicas[{i}].stages[{k}]", s) for i, g in enumerate(self.replicas) for k, s in enumerate(g.stages)]

    def _check_chips(self, source: str, available: Mapping[str, int], chips_field: str) -> None:
        for name, s in self.stage_names():
            if s.chip not in available:
                raise SpecError(source, f"{name}.chip", f"chip type {s.chip!r} is not in the cluster",
                                "one of " + ", ".join(available))
        for chip, n in self.chips_used().items():
            if n > available[chip]:
                raise SpecError(source, chips_field, f"plan uses {n} chips of type {chip!r}",
                                f"at most the cluster's {available[chip]}")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["chips_used"] = self.chips_used()
        if self.replicas:
            for key in ("stages", "dp", "micro_batches"):
                del d[key]  # the groups say it
        else:
            del d["replicas"]
        return d

    @staticmethod
    def _stages_from(raw: Any, source: str, at: str) -> list[StagePlan]:
        if not isinstance(raw, list):
            raise SpecError(source, at, f"got {type(raw).__name__}", "a list")
        stages = []
        allowed = {f for f in StagePlan.__dataclass_fields__}
        for i, s in enumerate(raw):
            if not isinstance(s, dict):
                raise SpecError(source, f"{at}[{i}]", f"got {type(s).__name__}", "a mapping")
            for k in ("chip", "tp", "layers"):
                if k not in s:
                    raise SpecError(source, f"{at}[{i}].{k}", "missing", "a value")
            extra = set(s) - allowed
            if extra:
                raise SpecError(
                    source, f"{at}[{i}].{sorted(extra)[0]}", "unknown field", "one of " + ", ".join(sorted(allowed))
                )
            stages.append(StagePlan(**s))
        return stages

    @classmethod
    def _groups_from(cls, data: dict[str, Any], source: str) -> list[ReplicaGroup]:
        """The replica groups of a plan file that lists them (`replicas`)."""
        for key in ("stages", "dp", "micro_batches"):
            if key in data:
                raise SpecError(source, key, "given together with replicas", "either replicas (each group's "
                                "stages, micro_batches and dp) or one stage list for every replica")
        raw = data["replicas"]
        if not isinstance(raw, list) or not raw:
            raise SpecError(source, "replicas", f"got {raw!r}", "a non-empty list of replica groups")
        groups = []
        for i, g in enumerate(raw):
            if not isinstance(g, dict):
                raise SpecError(source, f"replicas[{i}]", f"got {type(g).__name__}", "a mapping")
            extra = set(g) - {"stages", "micro_batches", "dp"}
            if extra:
                raise SpecError(source, f"replicas[{i}].{sorted(extra)[0]}", "unknown field",
                                "one of dp, micro_batches, stages")
            for key in ("stages", "micro_batches"):
                if key not in g:
                    raise SpecError(source, f"replicas[{i}].{key}", "missing", "a value")
            groups.append(ReplicaGroup(cls._stages_from(g["stages"], source, f"replicas[{i}].stages"),
                                       g["micro_batches"], g.get("dp", 1)))
        return groups

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "<plan>") -> "Plan":
        if not isinstance(data, dict):
            raise SpecError(source, "<top level>", f"got {type(data).__name__}", "a mapping")
        top = {f for f in cls.__dataclass_fields__} | {"chips_used"}
        extra = set(data) - top
        if extra:
            raise SpecError(source, sorted(extra)[0], "unknown field", "one of " + ", ".join(sorted(top)))
        kw = {k: v for k, v in data.items() if k not in ("stages", "chips_used", "replicas")}
        kw.setdefault("micro_batch_size", 1)
        if "replicas" in data:
            plan = cls.of_replicas(cls._groups_from(data, source), **kw).validate(source)
        else:
            for key in ("stages", "dp", "micro_batches"):
                if key not in data:
                    raise SpecError(source, key, "missing", "a value")
            plan = cls(stages=cls._stages_from(data["stages"], source, "stages"), **kw).validate(source)
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
