"""The package's C++ module: the fused statistics pass against float64 torch (and exact sums), and
a stats capture through the C++ op observer against one through the Python dispatch mode on a
HuggingFace Llama training run (CPU float32 standing in for the device; the Python hook is the
reference, and a planted 1e-4 fault must be found at the same op)."""
import html
import json
import math
import os
import shutil
from collections import Counter

import pytest
import torch

from ditorch_precision import Capture, Selector, compare_dumps, native
from ditorch_precision.cli import main
from ditorch_precision.dump import Dump
from ditorch_precision.report import diff_html
from ditorch_precision.signature import signature
from ditorch_precision.summaries import tensor_stats

from hf_llama_capture import FAULTY, capture_hf_llama
from stats_reference import assert_stats_are_float64_of

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.skipif(not native.available(), reason=f"C++ module not built: {native.why_not()}")]


def _reference(t: torch.Tensor):
    """(nan, inf, finite, min, max, sum, sum of squares) in float64, the sums exact (math.fsum)."""
    x = t.detach().to(torch.float64).reshape(-1)
    keep = x[torch.isfinite(x)]
    vals = keep.tolist()
    lo_hi = (min(vals), max(vals)) if vals else (None, None)
    return (int(x.isnan().sum()), int(x.isinf().sum()), len(vals), *lo_hi, math.fsum(vals),
            math.fsum(v * v for v in vals))


def _tensors():
    g = torch.Generator().manual_seed(0)
    base = torch.randn(37, 53, generator=g) * 3
    with_bad = base.clone()
    with_bad[3, 4], with_bad[10, 0], with_bad[36, 52] = float("nan"), float("inf"), float("-inf")
    all_bad = torch.full((5,), float("nan"))
    all_bad[1] = float("inf")
    out = {}
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        for name, t in (("plain", base), ("nan_inf", with_bad)):
            x = t.to(dtype)
            out[f"{dtype}-{name}"] = x
            out[f"{dtype}-{name}-transposed"] = x.t()
            out[f"{dtype}-{name}-strided"] = x[1::3, 2::5]
            out[f"{dtype}-{name}-offset"] = x[5:, 7:]
        out[f"{dtype}-all-nonfinite"] = all_bad.to(dtype)
    out["float32-expanded"] = torch.randn(1, 7, generator=g).expand(9, 7)
    out["float32-0dim"] = torch.tensor(2.5)
    out["float32-permuted-3d"] = torch.randn(4, 5, 6, generator=g).permute(2, 0, 1)[::2]
    out["float64-large"] = torch.tensor([1e200, -3e199, 5.0], dtype=torch.float64)
    for dtype in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
        out[f"{dtype}"] = torch.randint(0, 100, (17, 3), generator=g).to(dtype)[::2]
    return out


@pytest.mark.parametrize("name", sorted(_tensors()))
def test_fused_stats_equal_float64_torch(name):
    t = _tensors()[name]
    got = native.fused_stats(t)
    assert got is not None
    numel, nan, inf, finite, lo, hi, total, squares = got
    r_nan, r_inf, r_finite, r_lo, r_hi, r_sum, r_sq = _reference(t)
    assert (numel, nan, inf, finite) == (t.numel(), r_nan, r_inf, r_finite)
    if finite:
        assert (lo, hi) == (r_lo, r_hi)  # exact: the tensor's own values
        assert total == pytest.approx(r_sum, rel=1e-13, abs=1e-13 * math.sqrt(r_sq))
        assert squares == pytest.approx(r_sq, rel=1e-13)
    # the index's numbers (tensor_stats) against torch's float64 reductions
    s = tensor_stats(t)
    if finite:
        x = t.detach().double()
        x = x[torch.isfinite(x)]
        assert s["mean"] == pytest.approx(float(x.mean()), rel=1e-12, abs=1e-15)
        assert s["norm"] == pytest.approx(float(x.norm()), rel=1e-12)
    else:
        assert "mean" not in s and (s["nan"], s["inf"]) == (r_nan, r_inf)


def _lane_order_reference(values: list[float]) -> tuple:
    """min, max, sum, sum of squares of finite values in the pass's documented order: eight float64
    lanes, element 8j + k added to lane k, the last n % 8 elements to lane 0, the lanes then summed
    0..7; min and max keep the first of equal values (-0.0 against 0.0)."""
    lanes = [[0.0, 0.0, math.inf, -math.inf] for _ in range(8)]
    body = len(values) - len(values) % 8
    for i, v in enumerate(values):
        lane = lanes[i % 8 if i < body else 0]
        lane[0] += v
        lane[1] += v * v  # Python floats: each product rounded to float64 before the add, as the pass
        lane[2] = v if v < lane[2] else lane[2]
        lane[3] = v if v > lane[3] else lane[3]
    total = squares = 0.0
    lo, hi = math.inf, -math.inf
    for s, q, a, b in lanes:
        total, squares = total + s, squares + q
        lo, hi = (a if a < lo else lo), (b if b > hi else hi)
    return lo, hi, total, squares


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n", [5, 8, 4099, 70003])
def test_fused_stats_sums_are_those_of_its_lane_order_bit_for_bit(n, dtype):
    # The same program gives byte-identical index lines from build to build: the 32- and 16-bit
    # float passes (a kernel of their own) keep the generic pass's order of float64 adds, not just
    # its tolerance.
    g = torch.Generator().manual_seed(n)
    scale = 20 if dtype != torch.float16 else 4  # float16: subnormals to near its largest
    t = (torch.randn(n, generator=g) * torch.logspace(-scale, scale, n)).to(dtype)
    t[::7] = 0.0
    t[3::11] = -0.0
    values = t.double().tolist()
    got = native.fused_stats(t)
    lo, hi, total, squares = _lane_order_reference(values)
    assert got[4:] == (lo, hi, total, squares)
    assert (math.copysign(1, got[4]), math.copysign(1, got[5])) == (math.copysign(1, lo), math.copysign(1, hi))


def test_fused_stats_refuses_what_it_does_not_read():
    assert native.fused_stats(torch.ones(3, dtype=torch.bool)) is None
    assert native.fused_stats(torch.ones(3, dtype=torch.complex64)) is None
    assert native.fused_stats(torch.ones(2, 2).to_sparse()) is None
    assert native.fused_stats(torch.empty(0))[:4] == (0, 0, 0, 0)


def _capture(path, hook, fault=False, steps=2):
    return capture_hf_llama(path, "stats", hook, fault, steps)[0]


@pytest.fixture(scope="module")
def hooked(tmp_path_factory):
    root = tmp_path_factory.mktemp("hooks")
    torch.set_num_threads(1)
    return {"python": _capture(root / "python", "python"), "cpp": _capture(root / "cpp", "cpp"),
            "cpp_bad": _capture(root / "cpp_bad", "cpp", fault=True)}


def test_a_cpp_hooked_capture_compares_equal_to_a_python_hooked_one(hooked):
    report = compare_dumps(hooked["cpp"], hooked["python"])
    d = report.to_dict()
    assert report.passed and d["n_failed"] == 0
    # both hooks number the same ops; the only unmatched ones are the gradient sums autograd makes
    # in place (add_) without a mode and out of place (add) under one: the rest is paired and judged
    assert d["n_passed"] > 0.9 * len(Dump.open(hooked["cpp"]).op_records)
    assert d["n_unmatched"] > 0 and {(u["op"], u["phase"]) for u in d["unmatched"]} == {
        ("aten::add_", "backward"), ("aten::add", "backward")}
    # every matmul is seen in the same phase and module by both hooks (backward: from the autograd
    # node's module tag; optimizer phase from the optimizer hooks)
    keys = {}
    for hook in ("python", "cpp"):
        recs = Dump.open(hooked[hook]).op_records
        keys[hook] = Counter((r["op"], r["phase"], r["module"], r["step"]) for r in recs
                             if r["op"] in ("aten::mm", "aten::bmm", "aten::_foreach_mul_", "aten::_fused_adamw_"))
        assert {k[1] for k in keys[hook]} >= {"forward", "backward"}
    assert keys["cpp"] == keys["python"]
    # arguments are compared as before: the same signatures for the same ops
    sig = {hook: [r["signature"] for r in Dump.open(hooked[hook]).op_records if r["op"] == "aten::mm"]
           for hook in ("python", "cpp")}
    assert sig["cpp"] == sig["python"] and sig["cpp"]


def test_a_planted_fault_is_found_at_the_same_op_through_the_cpp_hook(hooked):
    for reference in ("cpp", "python"):
        fd = compare_dumps(hooked["cpp_bad"], hooked[reference]).first_divergence
        assert (fd["op"], fd["module"], fd["rule"], fd["step"]) == ("aten::mm", FAULTY, "stats", 0)


def test_a_compare_of_captures_made_through_different_hooks_says_so_first(hooked, capsys):
    # an op a dispatch mode makes torch run out of place differs between the hooks: the unmatched
    # ops are only counted, so the report names the hooks before anything else
    hooks = {}
    for name in ("cpp", "python"):
        with open(os.path.join(hooked[name], "meta.json")) as f:
            hooks[name] = json.load(f)["hook"]
    assert hooks == {"cpp": "cpp", "python": "python"}
    report = compare_dumps(hooked["cpp"], hooked["python"])
    (note,) = report.notes
    assert "'cpp'" in note and "'python'" in note and "unmatched" in note
    assert report.to_dict()["notes"] == [note]
    assert compare_dumps(hooked["cpp_bad"], hooked["cpp"]).notes == []
    assert main(["compare", hooked["cpp"], hooked["python"]]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"note: {note}"
    assert main(["compare", hooked["cpp"], hooked["python"], "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["notes"] == [note]
    assert f"<b>Note</b>: {html.escape(note)}" in diff_html(report)
    assert main(["compare", hooked["cpp_bad"], hooked["cpp"]]) == 1
    assert not any(line.startswith("note:") for line in capsys.readouterr().out.splitlines())



def test_a_multi_rank_compare_names_the_ranks_captured_through_other_hooks(hooked, tmp_path, capsys):
    for run, hooks in (("a", ("cpp", "cpp")), ("b", ("python", "cpp"))):
        for rank, hook in enumerate(hooks):
            shutil.copytree(hooked[hook], tmp_path / run / f"rank{rank}")
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("note: rank 0: ") and "(A: 'cpp', B: 'python')" in out[0]
    assert not out[1].startswith("note:")


def test_an_op_that_raises_is_not_recorded_and_the_capture_goes_on(tmp_path):
    with Capture(str(tmp_path / "c"), mode="stats", hook="cpp"):
        a = torch.ones(2, 3)
        with pytest.raises(RuntimeError):
            torch.mm(a, a)  # shapes do not fit
        torch.mm(a, a.t())
    ops = [r["op"] for r in Dump.open(str(tmp_path / "c")).op_records]
    assert ops == ["aten::ones", "aten::t", "aten::mm"]


def test_the_hook_is_chosen_and_a_cpp_hook_that_cannot_run_says_why(tmp_path):
    with pytest.raises(ValueError, match="hook 'nope'"):
        Capture(str(tmp_path / "a"), hook="nope")
    with pytest.raises(ValueError, match="mode 'checksum'"):
        with Capture(str(tmp_path / "b"), mode="checksum", hook="cpp"):
            pass
    with pytest.raises(ValueError, match="bulk=False"):  # a full capture's per-op files: Python
        with Capture(str(tmp_path / "b2"), hook="cpp", bulk=False):
            pass
    with Capture(str(tmp_path / "b3")) as cap:  # a full capture in part files: "auto" picks C++
        torch.ones(2).sum()
    assert cap.hook_used == "cpp" and Dump.open(str(tmp_path / "b3")).meta["hook"] == "cpp"
    with Capture(str(tmp_path / "b4"), bulk=False) as cap:  # per-op files: "auto" picks Python
        torch.ones(2).sum()
    assert cap.hook_used == "python"
    with pytest.raises(ValueError, match="selection"):
        with Capture(str(tmp_path / "c"), mode="stats", hook="cpp", selector=Selector.build(modules="x")):
            pass
    with Capture(str(tmp_path / "d"), mode="stats", selector=Selector.build(steps="0")) as cap:
        torch.ones(2).sum()
    assert cap.hook_used == "python" and Dump.open(str(tmp_path / "d")).meta["hook"] == "python"
    with Capture(str(tmp_path / "e"), mode="stats") as outer, Capture(str(tmp_path / "f"), mode="stats") as inner:
        torch.ones(2).sum()
    assert (outer.hook_used, inner.hook_used) == ("cpp", "python")


def test_a_dtype_default_is_named_as_a_dtype():
    # randint's dtype defaults to long, which the schema gives as an int: "int64", as a dtype passed
    # explicitly reads (it read 4)
    sig = signature("aten::randint", "low_generator", (0, 64, [2, 8]), {"generator": None})
    assert sig["dtype"] == str(torch.int64).removeprefix("torch.")
    assert signature("aten::empty", "memory_format", ([2],), {"dtype": torch.bfloat16})["dtype"] == "bfloat16"


def test_reused_statistics_of_views_and_module_records_against_float64_of_the_full_capture(tmp_path):
    """The C++ hook computes a tensor's statistics once per step (a view holding its input's
    elements, a module's output that is an op's output) and must not reuse them after an in-place
    write: every op and module record of the program of test_precision_dump_modes against float64
    torch over the tensors a full capture through the Python hook saved at the same op. Both hooks
    number the same ops (this program has none a dispatch mode runs out of place): the records pair
    one to one."""
    from test_precision_dump_modes import _stats_program

    with Capture(str(tmp_path / "stats"), mode="stats", hook="cpp"):
        _stats_program()
    with Capture(str(tmp_path / "full"), hook="python"):
        _stats_program()
    stats, full = Dump.open(str(tmp_path / "stats")).records, Dump.open(str(tmp_path / "full"))
    fulls = full.records
    place = ("kind", "op", "overload", "index", "phase", "module", "step")
    assert [[r.get(k) for k in place] for r in stats] == [[r.get(k) for k in place] for r in fulls]
    checked = Counter()
    for rs, rf in zip(stats, fulls):
        if rs.get("unwritten"):
            continue
        assert_stats_are_float64_of(rs, rf, full)
        checked[rs["op"]] += 1
    # the views taken after in-place writes, and the module records, were among those checked
    assert checked["aten::t"] and checked["aten::_unsafe_view"] + checked["aten::view"] and checked["module::output"]


def test_an_op_registered_after_another_was_removed_is_named_by_its_own_schema(tmp_path):
    # The C++ observer keeps what it learnt of each op for the process, by the schema's name; an op
    # removed (its library destroyed) and another one registered after it, in the same namespace,
    # must not be taken for it. Reference: the Python dispatch mode's records of the same program.
    seen = {"cpp": [], "python": []}
    for name in ("first_op", "second_op"):
        lib = torch.library.Library("precision_test_ops", "DEF")
        lib.define(f"{name}(Tensor x) -> Tensor")
        lib.impl(name, lambda x: x.clone(), "CPU")
        op = getattr(torch.ops.precision_test_ops, name)
        for hook in seen:
            with Capture(str(tmp_path / f"{name}_{hook}"), mode="stats", hook=hook) as cap:
                op(torch.ones(3))
            assert cap.hook_used == hook
            ops = [r["op"] for r in Dump.open(str(tmp_path / f"{name}_{hook}")).op_records]
            seen[hook].append([o for o in ops if o.startswith("precision_test_ops::")])
        lib._destroy()
    assert seen["python"] == [["precision_test_ops::first_op"], ["precision_test_ops::second_op"]]
    assert seen["cpp"] == seen["python"]
