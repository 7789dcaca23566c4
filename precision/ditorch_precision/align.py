"""Aligning two captures by structure, not by call index: an op is identified by its step, phase
and module path, then by its place among that module's own ops (op name and output shapes, in
order). Known variants of one op (the attention kernels each device picks) count as the same op
through an equivalence table the user can extend. Where a module's op sequences differ between the
runs (another attention implementation, an inserted op), the ops that cannot be paired are
reported as unmatched, and the module becomes a region judged by its module records (outputs in
forward, output gradients in backward, of the module and its direct children)."""
from __future__ import annotations

import difflib
import json
from collections import defaultdict
from dataclasses import dataclass, field

from .mixed_precision import MixedPrecision

PARAMS_OP = "optimizer::params"  # a module record: an optimizer's parameters after its step
# A module record of what an optimizer step starts from (optimizer_replay): data for a replay, not aligned.
INPUTS_OP = "optimizer::inputs"

# Inside a module whose op sequences differ, a run of alike ops between two differences, one of them more
# ops on one side than on the other, is paired only from this length on: shorter ones (a view or a transpose
# of the same shape) match by coincidence (_coincidence).
MIDDLE_RUN = 4

# Ops that compute the same thing by different kernels; the first of each group names it.
DEFAULT_EQUIVALENT: tuple[tuple[str, ...], ...] = (
    ("aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_scaled_dot_product_flash_attention",
     "aten::_scaled_dot_product_efficient_attention", "aten::_scaled_dot_product_cudnn_attention",
     "aten::_scaled_dot_product_fused_attention_overrideable"),
    ("aten::_scaled_dot_product_flash_attention_for_cpu_backward",
     "aten::_scaled_dot_product_flash_attention_backward", "aten::_scaled_dot_product_efficient_attention_backward",
     "aten::_scaled_dot_product_cudnn_attention_backward",
     "aten::_scaled_dot_product_fused_attention_overrideable_backward"),
    ("aten::_fused_adamw_", "aten::_fused_adam_"),
)


class Equivalences:
    """op name -> the name of its equivalence group (itself when it has none)."""

    def __init__(self, groups=DEFAULT_EQUIVALENT) -> None:
        self.groups: list[tuple[str, ...]] = []
        self._canon: dict[str, str] = {}
        # op -> names of arguments whose differences between the runs are known to be benign
        self.ignored_arguments: dict[str, frozenset[str]] = {}
        self.mixed_precision = MixedPrecision()  # dtypes the runs store differently by design
        for g in groups:
            self.add(g)

    def add(self, group) -> None:
        group = tuple(group)
        if len(group) < 2 or not all(isinstance(op, str) and "::" in op for op in group):
            raise ValueError(f"equivalence group {list(group)!r}: expected two or more op names like 'aten::mm'")
        name = self._canon.get(group[0], group[0])
        for op in group:
            self._canon[op] = name
        self.groups.append(group)

    @classmethod
    def load(cls, path: str | None) -> "Equivalences":
        """The defaults, extended by a JSON file ``{"equivalent": [["aten::a", "aten::b"], ...],
        "ignore_arguments": {"aten::a": ["name", ...]}, "mixed_precision": ["float32", "bfloat16"]}``
        (each key optional; ``ditorch_precision.mixed_precision``)."""
        eq = cls()
        if path is None:
            return eq
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"{path}: unreadable equivalence table ({exc})") from None
        groups = data.get("equivalent", []) if isinstance(data, dict) else None
        ignored = data.get("ignore_arguments", {}) if isinstance(data, dict) else None
        keys = {"equivalent", "ignore_arguments", "mixed_precision"}
        if not isinstance(groups, list) or not isinstance(ignored, dict) or not set(data) & keys:
            raise ValueError(f"{path}: expected {{\"equivalent\": [[\"aten::a\", \"aten::b\"], ...], "
                             f"\"ignore_arguments\": {{\"aten::a\": [\"name\", ...]}}, "
                             f"\"mixed_precision\": [\"float32\", \"bfloat16\"]}} (each key optional)")
        if "mixed_precision" in data:
            eq.mixed_precision = MixedPrecision.parse(data["mixed_precision"], path)
        for op, names in ignored.items():
            if "::" not in op or not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise ValueError(f"{path}: ignore_arguments entry {op!r}: {names!r}; expected an op name like "
                                 "'aten::a' and a list of argument names")
            eq.ignored_arguments[op] = frozenset(names)
        for g in groups:
            if not isinstance(g, list):
                raise ValueError(f"{path}: equivalence group {g!r} is not a list")
            try:
                eq.add(g)
            except ValueError as exc:
                raise ValueError(f"{path}: {exc}") from None
        return eq

    def canon(self, op: str) -> str:
        return self._canon.get(op, op)

    def has_variants(self, op: str) -> bool:
        return op in self._canon


def group_key(rec: dict) -> tuple:
    phase = "forward" if rec.get("phase") == "recompute" else rec.get("phase")
    return rec.get("step"), phase, rec.get("module")


def _shapes(rec: dict, first_only: bool) -> tuple:
    outs = [tuple(o["shape"]) for o in rec.get("outputs") or [] if isinstance(o, dict) and "shape" in o]
    return tuple(outs[:1]) if first_only else tuple(outs)


@dataclass
class Alignment:
    pairs: list[tuple[dict, dict]] = field(default_factory=list)  # ops paired one to one
    unmatched_a: list[dict] = field(default_factory=list)
    unmatched_b: list[dict] = field(default_factory=list)
    regions: list[tuple] = field(default_factory=list)  # (step, phase, module) whose op sequences differ
    module_pairs: list[tuple[dict, dict]] = field(default_factory=list)  # module records, paired
    unmatched_modules_a: list[dict] = field(default_factory=list)  # module records the other run lacks
    unmatched_modules_b: list[dict] = field(default_factory=list)
    # casts between the dtypes of a declared mixed-precision policy: not aligned (one run needs them)
    casts_a: list[dict] = field(default_factory=list)
    casts_b: list[dict] = field(default_factory=list)


def align(records_a: list[dict], records_b: list[dict], eq: Equivalences | None = None) -> Alignment:
    eq = eq or Equivalences()
    out = Alignment()
    ops_a: dict = defaultdict(list)
    ops_b: dict = defaultdict(list)
    mods_a: dict = defaultdict(list)
    mods_b: dict = defaultdict(list)
    for recs, ops, mods, casts in ((records_a, ops_a, mods_a, out.casts_a), (records_b, ops_b, mods_b, out.casts_b)):
        for r in sorted(recs, key=lambda r: r["index"]):
            if r.get("kind", "op") == "module":
                if r["op"] == INPUTS_OP:
                    continue
                mods[(*group_key(r), r["op"])].append(r)
            elif eq.mixed_precision.is_cast(r):
                casts.append(r)
            else:
                ops[group_key(r)].append(r)
    for key in list(ops_a) + [k for k in ops_b if k not in ops_a]:
        sa, sb = ops_a.get(key, []), ops_b.get(key, [])

        def token(r):  # equivalent kernels agree on their first output (the result) only
            variants = eq.has_variants(r["op"])  # an op's overloads take different arguments: not one op
            return eq.canon(r["op"]), None if variants else r.get("overload"), _shapes(r, first_only=variants)

        ta, tb = [token(r) for r in sa], [token(r) for r in sb]
        codes = difflib.SequenceMatcher(None, ta, tb, autojunk=False).get_opcodes()
        apart = [k for k, (tag, *_) in enumerate(codes) if tag != "equal"]
        for k, (tag, i1, i2, j1, j2) in enumerate(codes):
            if tag == "equal" and not _coincidence(codes, k, apart):
                out.pairs.extend(zip(sa[i1:i2], sb[j1:j2]))
            else:
                out.unmatched_a.extend(sa[i1:i2])
                out.unmatched_b.extend(sb[j1:j2])
        if apart:
            out.regions.append(key)
    for key in list(mods_a) + [k for k in mods_b if k not in mods_a]:
        ma, mb = mods_a.get(key, []), mods_b.get(key, [])
        out.module_pairs.extend(zip(ma, mb))
        out.unmatched_modules_a.extend(ma[len(mb):])  # a module called more often in one run
        out.unmatched_modules_b.extend(mb[len(ma):])
    return out


def _coincidence(codes: list, k: int, apart: list[int]) -> bool:
    """Whether the run of alike ops codes[k] (an "equal" opcode) is a coincidence of names and shapes, not
    the same computation: shorter than MIDDLE_RUN, between two differences, and next to one that is no
    op-for-op substitution (a view of sdpa's output gradient against a view of eager attention's weights'
    gradient, between sdpa's one kernel and eager's dozen). Between substitutions of one op for one (a
    gradient sum `add_` where the other run has `add`) the ops keep their places and stay paired."""
    _, i1, i2, _, _ = codes[k]
    if not apart or not apart[0] < k < apart[-1] or i2 - i1 >= MIDDLE_RUN:
        return False
    return any(b2 - b1 != d2 - d1 for _, b1, b2, d1, d2 in (codes[k - 1], codes[k + 1]))


def region_module_records(alignment: Alignment, region: tuple) -> list[tuple[dict, dict]]:
    """The module record pairs that judge a region: outputs (forward) or output gradients
    (backward) of the region's module and of its direct children, in the region's step; for an
    optimizer region, the parameters after that step."""
    step, phase, module = region
    if phase == "optimizer":  # the parameters after the step (Capture's "optimizer::params" records)
        return [(ra, rb) for ra, rb in alignment.module_pairs if ra["op"] == PARAMS_OP and ra.get("step") == step]
    if module is None or phase not in ("forward", "backward"):
        return []
    op = "module::output" if phase == "forward" else "module::grad"
    depth = module.count(".") + 1
    picked = []
    for ra, rb in alignment.module_pairs:
        m = ra.get("module") or ""
        if ra["op"] == op and ra.get("step") == step and (
                m == module or (m.startswith(module + ".") and m.count(".") == depth)):
            picked.append((ra, rb))
    return picked
