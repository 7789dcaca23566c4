"""The tools' fast paths against slow references: the quick pass of the comparison library against
the full comparison, autocompare with and without full statistics, overflow_check (with and
without host reads per op) against a plain per-op Inf/NaN check written here, capture's uncopied
and bulk saves against per-op files, and that a tool's own checks stay hidden from a tool stacked
outside it."""
import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ditorch_precision import AutoCompare, Capture, Dump, OpTimer, OverflowCheck, Selector, compare_dumps
from ditorch_precision.dump import VERSION
from ditorch_precision.examples.faults import wrong_kernel
from ditorch_precision.examples.tiny_llama import LlamaConfig, make_model, train
from ditorch_precision.metrics import compare_trees, quick_pass
from ditorch_precision.tool import Tool
from program_ops import OpLog, called_by_program

CFG = LlamaConfig(dim=32, hidden=64, heads=4, seq=8, batch=2, layers=2)
INF, NAN = math.inf, math.nan


pytestmark = pytest.mark.usefixtures("one_thread")


# quick pass vs full comparison ---------------------------------------------------------------------
def _cases():
    g = torch.Generator().manual_seed(1)
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        for scale in (0.0, 1e-9, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 3e-2):
            for magnitude in (1e-3, 1.0, 1e3):
                e = torch.randn(64, generator=g, dtype=torch.float64) * magnitude
                noise = torch.randn(64, generator=g, dtype=torch.float64) * scale * e.abs().clamp_min(1e-6)
                yield (e + noise).to(dtype), e
    e = torch.tensor([1.0, -INF, 2.0, INF], dtype=torch.float64)
    yield e.float(), e  # the same infinities: pass
    yield torch.tensor([1.0, INF, 2.0, INF]), e  # opposite infinity
    yield torch.tensor([1.0, -INF, 2.1, INF]), e  # a finite place out of tolerance next to infinities
    yield torch.tensor([1.0, NAN, 2.0, INF]), e
    yield torch.tensor([NAN, 1.0]), torch.tensor([NAN, 1.0], dtype=torch.float64)  # NaN on both sides
    yield torch.tensor([1e38, -1e38]).double() * 1e270, torch.tensor([-1e308, 1e308], dtype=torch.float64)
    atol, rtol = 1e-5, 1e-5  # float32 defaults; exactly on the bound and one step past it
    yield torch.tensor([1.0 + atol + rtol], dtype=torch.float64), torch.tensor([1.0], dtype=torch.float64)
    yield torch.tensor([2.0]), torch.tensor([2.0 + atol + 2 * rtol], dtype=torch.float64)
    yield torch.arange(6), torch.arange(6)  # exact: equal, different, other dtype
    yield torch.arange(6), torch.arange(6).flip(0)
    yield torch.tensor([True, False]), torch.tensor([True, False])
    yield torch.arange(6, dtype=torch.int32), torch.arange(6)
    yield torch.ones(2, 3), torch.ones(3, 2, dtype=torch.float64)  # shape
    yield torch.ones(3), torch.ones(3, dtype=torch.int64)  # float against integer
    yield torch.zeros(0), torch.zeros(0, dtype=torch.float64)  # empty
    yield (torch.ones(3), torch.arange(3)), (torch.ones(3, dtype=torch.float64), torch.arange(3))  # a tree
    yield (torch.ones(3), torch.ones(3)), (torch.ones(3, dtype=torch.float64),)  # counts differ


@pytest.mark.filterwarnings("ignore:overflow encountered")  # the full statistics of the 1e308 case
def test_quick_pass_agrees_with_the_full_comparison():
    n_quick = n_full_pass = n_full_fail = 0
    for actual, expected in _cases():
        full = compare_trees(actual, expected)
        quick = quick_pass(actual, expected)
        n_full_pass += full.passed
        n_full_fail += not full.passed
        if quick is None:
            continue
        n_quick += 1
        summary = full.summary()
        assert full.passed, (actual, expected)
        assert {k: quick[k] for k in ("passed", "rule", "detail", "max_abs")} == \
               {k: summary[k] for k in ("passed", "rule", "detail", "max_abs")}
    # the cases cover both outcomes, and the quick pass decides most of the passes
    assert n_full_fail >= 20 and n_quick >= 0.8 * n_full_pass


def test_quick_pass_leaves_its_inputs_alone():
    a = torch.randn(16, dtype=torch.float64)
    e = a + 1e-9
    a0, e0 = a.clone(), e.clone()
    assert quick_pass(a, e) is not None
    assert torch.equal(a, a0) and torch.equal(e, e0)


# autocompare: quick rows against full rows on the real model ---------------------------------------
def _key(rows):
    return [(r["index"], r["op"], r["status"], r["rule"], r["detail"]) for r in rows]


def test_autocompare_fast_path_gives_the_full_paths_verdicts():
    with wrong_kernel("silu"):
        with AutoCompare() as fast:
            train(1, CFG, optimizer="sgd")
        with AutoCompare(full_stats=True) as full:
            train(1, CFG, optimizer="sgd")
    assert _key(fast.results) == _key(full.results)
    assert fast.failures and fast.failures[0]["op"] == "aten::silu"
    assert fast.summary()["first_failure"]["index"] == full.summary()["first_failure"]["index"]
    assert all(r["max_abs"] == f["max_abs"] for r, f in zip(fast.results, full.results) if "max_abs" in r)
    # passes carry max_abs only; failures carry the full statistics
    assert any("max_ulp" not in r for r in fast.results if r["status"] == "pass")
    assert all("max_ulp" in r and "cosine" in r for r in fast.failures)


# overflow_check against a plain check of every op --------------------------------------------------
class PlainOverflow(TorchDispatchMode):
    """Every op: inputs checked with isfinite before it runs, outputs after it; an event where the
    outputs hold Inf/NaN (or exceed ``range_max``) and the inputs did not."""

    def __init__(self, range_max=None):
        super().__init__()
        self.range_max, self.index, self.events = range_max, 0, []

    def _problem(self, tree, what):
        tensors = [t for t in tree_leaves(tree)
                   if isinstance(t, torch.Tensor) and t.dtype.is_floating_point and t.numel()]
        for i, t in enumerate(t.detach() for t in tensors):
            if not torch.isfinite(t).all():
                n_nan, n_inf = int(t.isnan().sum()), int(t.isinf().sum())
                return ("nan" if n_nan else "inf"), f"{what} {i}: {n_nan} NaN, {n_inf} Inf of {t.numel()}"
            if self.range_max is not None and float(t.abs().max()) > self.range_max:
                return "range", f"{what} {i}: |max| {float(t.abs().max()):.4g} exceeds {self.range_max:.4g}"
        return None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not called_by_program(func):
            return func(*args, **kwargs)
        index, self.index = self.index, self.index + 1
        scalars = any(isinstance(x, float) and not math.isfinite(x) for x in tree_leaves((args, kwargs)))
        inputs_ok = self._problem((args, kwargs), "input") is None and not scalars
        out = func(*args, **kwargs)
        problem = self._problem(out, "output") if inputs_ok else None
        if problem is not None:
            self.events.append((index, func._schema.name, *problem))
        return out


def _overflowing_model(magnitude=3e38):
    """With the default, layers.1.mlp.w1's matmul overflows float32; with 1e4, float16's range."""
    torch.manual_seed(0)
    model = make_model(CFG)
    with torch.no_grad():
        w = model.layers[1].mlp.w1.weight
        w.copy_(torch.sign(w) * magnitude)
    return model, torch.randint(0, CFG.vocab, (CFG.batch, CFG.seq))


def _events(tool):
    return [(e.index, e.op, e.kind, e.detail) for e in tool.events]


@pytest.mark.parametrize("range_dtype", [None, torch.float16])
def test_overflow_check_matches_a_plain_check_of_every_op(range_dtype):
    model, tokens = _overflowing_model(1e4 if range_dtype else 3e38)
    range_max = torch.finfo(range_dtype).max if range_dtype else None
    with PlainOverflow(range_max) as plain:
        model(tokens).sum().backward()
    with OverflowCheck(range_dtype=range_dtype) as fast:
        model(tokens).sum().backward()
    with OverflowCheck(range_dtype=range_dtype, sync=False) as nosync:
        model(tokens).sum().backward()
    assert plain.events and len(plain.events) < 100
    assert _events(fast) == plain.events
    assert _events(nosync) == plain.events


def test_overflow_check_without_sync_reports_the_planted_inf_at_its_op_and_module():
    model, tokens = _overflowing_model()
    with OverflowCheck(sync=False) as oc:
        model(tokens).sum().backward()
        assert oc.events == []  # nothing is read before a step, a flush or the exit
        oc.flush()
        first = oc.first
    assert first.op == "aten::mm" and first.module == "TinyLlama.layers.1.mlp.w1" and first.phase == "forward"
    assert first.kind == "inf" and any("test_precision_fastpaths.py" in frame for frame in first.stack)
    with pytest.raises(Exception) as info:
        with OverflowCheck(sync=False, raise_on_first=True):
            model(tokens)
    assert "aten::mm" in str(info.value) and "layers.1.mlp.w1" in str(info.value)


def test_overflow_check_sees_an_in_place_op_overflow_its_own_input():
    with OverflowCheck() as oc:
        x = torch.full((4,), 3e38)
        x.add_(x)  # finite before, Inf after: the input is checked before the op overwrites it
    assert oc.first is not None and oc.first.op == "aten::add_" and oc.first.kind == "inf"


# capture: uncopied saves hold the values of the moment ---------------------------------------------
def test_capture_saves_inputs_before_in_place_ops_and_views_whole(tmp_path):
    a = torch.arange(12.0).reshape(3, 4)
    b = torch.ones(5, 4)
    with Capture(str(tmp_path / "c"), Selector.build(ops="mm,add_,t")):
        c = a @ b.t()  # t: a transposed view of all of b; mm reads it
        c.add_(1.0)  # in place: the input saved is the value before
        c.add_(1.0)
    dump = Dump.open(str(tmp_path / "c"))
    data = [dump.load(r) for r in dump.records]
    assert [r["op"] for r in dump.records] == ["aten::t", "aten::mm", "aten::add_", "aten::add_"]
    torch.testing.assert_close(data[0]["outputs"], b.t(), rtol=0, atol=0)
    torch.testing.assert_close(data[1]["outputs"], a @ b.t(), rtol=0, atol=0)
    torch.testing.assert_close(data[2]["args"][0], a @ b.t(), rtol=0, atol=0)
    torch.testing.assert_close(data[3]["args"][0], a @ b.t() + 1, rtol=0, atol=0)
    torch.testing.assert_close(data[3]["outputs"], a @ b.t() + 2, rtol=0, atol=0)


# stacked tools: an inner tool's own checks are not the program's ops -------------------------------
@pytest.mark.parametrize("inner", [lambda: OverflowCheck(), lambda: AutoCompare(Selector.build(ops="mm,silu"))])
def test_an_outer_tool_sees_only_the_programs_ops(inner):
    with OpLog() as log:
        train(1, CFG, optimizer="sgd")
    with OpTimer() as outer:
        with inner():
            train(1, CFG, optimizer="sgd")
    expected: dict = {}
    for op in log.ops:
        if not op.startswith("profiler::"):  # tools do not time the profiler's markers
            expected[op] = expected.get(op, 0) + 1
    assert {e.op: e.count for e in outer.times.values()} == expected


def test_capture_in_bulk_reads_back_what_per_op_files_hold(tmp_path):
    sel = Selector.build(modules="layers.1.mlp")
    with Capture(str(tmp_path / "per_op"), sel, bulk=False):
        train(2, CFG, optimizer="adamw")
    with Capture(str(tmp_path / "bulk"), sel, bulk=True) as bulk:
        train(2, CFG, optimizer="adamw")
    a, b = Dump.open(str(tmp_path / "per_op")), Dump.open(str(tmp_path / "bulk"))
    assert [(r["index"], r["op"]) for r in a.records] == [(r["index"], r["op"]) for r in b.records]
    assert {r["step"] for r in b.records} == {0, 1} and b.meta["bulk"] and b.meta["version"] == VERSION
    assert len({r["file"] for r in b.records}) == 2 == bulk._n_parts  # one file per step
    for ra, rb in zip(a.records, b.records):
        la, lb = tree_leaves(a.load(ra)), tree_leaves(b.load(rb))
        assert len(la) == len(lb)
        for x, y in zip(la, lb):
            if isinstance(x, torch.Tensor):
                assert isinstance(y, torch.Tensor) and torch.equal(x, y), (ra["op"], ra["index"])
            else:
                assert x == y
    report = compare_dumps(str(tmp_path / "bulk"), str(tmp_path / "per_op"))  # the CLI's reader path
    assert report.passed and len(report.ops) == len(a.op_records)


def test_capture_in_bulk_keeps_a_held_tensor_from_a_later_in_place_write(tmp_path):
    with Capture(str(tmp_path / "c"), Selector.build(ops="mul"), bulk=True):
        x = torch.ones(4)
        y = x * 2  # captured, held uncopied until the exit
        y.add_(1)  # not captured, but it writes y: the held y is copied first
        x.zero_()
    dump = Dump.open(str(tmp_path / "c"))
    (rec,) = dump.records
    data = dump.load(rec)
    assert torch.equal(data["args"][0], torch.ones(4)) and torch.equal(data["outputs"], torch.full((4,), 2.0))


def test_capture_per_op_writes_a_tensor_several_ops_read_once(tmp_path):
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(0))
    with Capture(str(tmp_path / "c"), Selector.build(ops="sin,cos,mul"), bulk=False):
        y = x.sin()
        z = y.cos()  # reads y, which sin's file already holds
        w = y * z
        y.add_(1)  # not captured: y changes, so the next read of it must be written again
        v = y * 2
    dump = Dump.open(str(tmp_path / "c"))
    data = [dump.load(r) for r in dump.records]
    # the references: plain torch, recomputed here
    y0 = x.sin()
    torch.testing.assert_close(data[1]["args"][0], y0, rtol=0, atol=0)
    torch.testing.assert_close(data[2]["args"][0], y0, rtol=0, atol=0)
    torch.testing.assert_close(data[2]["args"][1], y0.cos(), rtol=0, atol=0)
    torch.testing.assert_close(data[2]["outputs"], w, rtol=0, atol=0)
    torch.testing.assert_close(data[3]["args"][0], y0 + 1, rtol=0, atol=0)
    torch.testing.assert_close(data[3]["outputs"], v, rtol=0, atol=0)
    # x, y, z, w, y + 1 and v once each (plus the files' own headers), not the 9 tensors the ops read and wrote
    written = sum(f.stat().st_size for f in (tmp_path / "c" / "tensors").iterdir())
    assert written < 6 * x.nbytes + 4 * 4096, written


def test_capture_per_op_writes_again_a_tensor_changed_behind_its_version_counter(tmp_path):
    w = torch.ones(8, 8)
    with Capture(str(tmp_path / "c"), Selector.build(ops="sin")):
        w.sin()
        w.data.add_(1)  # `.data` has its own version counter: w's does not move
        w.sin()
    dump = Dump.open(str(tmp_path / "c"))
    first, second = (dump.load(r) for r in dump.records)
    assert torch.equal(first["args"][0], torch.ones(8, 8)) and torch.equal(second["args"][0], torch.full((8, 8), 2.0))


def test_capture_module_outputs_an_op_file_holds_are_named_in_the_index(tmp_path):
    lin = torch.nn.Linear(8, 4)
    x = torch.randn(3, 8, requires_grad=True)
    with Capture(str(tmp_path / "c"), Selector.build(modules="Linear"), bulk=False):
        y = lin(x)
        y.sum().backward()
    dump = Dump.open(str(tmp_path / "c"))
    out, grad = (r for r in dump.records if r.get("kind") == "module")
    assert (out["op"], grad["op"]) == ("module::output", "module::grad") and out["file"] is None and out["refs"]
    with torch.no_grad():  # the reference: plain torch
        torch.testing.assert_close(dump.load(out)["outputs"][0], x @ lin.weight.t() + lin.bias, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(dump.load(grad)["outputs"][0], torch.ones(3, 4), rtol=0, atol=0)


def test_capture_per_op_names_views_of_written_tensors_without_a_file(tmp_path):
    """A view op whose input an earlier file holds writes no file: its tensors are references, the
    view's as (file, tensor, size, stride, offset). A write to the base afterwards makes the next view
    be written again. Reference: plain torch."""
    x = torch.randn(4, 6)
    with Capture(str(tmp_path / "c"), Selector.build(ops="*"), bulk=False):
        y = x.exp()
        v = y.t()  # a view covering y's storage
        s = y[1:3, 2:5]  # a view of part of it
        z = s.sum()
        y.mul_(2)
        w = y.t()  # y changed since its file: written again
    dump = Dump.open(str(tmp_path / "c"))
    files = [(r["op"], r["file"] is not None) for r in dump.op_records]
    assert files == [("aten::exp", True), ("aten::t", False), ("aten::slice", False), ("aten::slice", False),
                     ("aten::sum", True), ("aten::mul_", True), ("aten::t", True)]
    with torch.no_grad():
        loaded = [dump.load(r) for r in dump.op_records]
        by_op = [(r["op"], d) for r, d in zip(dump.op_records, loaded)]
        ts = [d for op, d in by_op if op == "aten::t"]
        torch.testing.assert_close(ts[0]["outputs"], x.exp().t(), rtol=0, atol=0)
        torch.testing.assert_close(ts[1]["outputs"], w, rtol=0, atol=0)
        assert dump.op_records[-1]["file"] is not None  # the view after the write
        slices = [d for op, d in by_op if op == "aten::slice"]
        torch.testing.assert_close(slices[-1]["outputs"], x.exp()[1:3, 2:5], rtol=0, atol=0)
        sums = [d for op, d in by_op if op == "aten::sum"]
        torch.testing.assert_close(sums[0]["args"][0], x.exp()[1:3, 2:5], rtol=0, atol=0)
        torch.testing.assert_close(sums[0]["outputs"], z, rtol=0, atol=0)
    assert v.shape == (6, 4)


def test_a_view_of_a_storage_written_where_no_tool_sees_is_saved_again(tmp_path):
    """A write no tool sees (a tool's own quiet block) still bumps the version counter the base and
    its views share: a later view of that storage is saved again, not named as a view of the stale
    file. Reference: the values plain torch computes."""
    x = torch.randn(8, dtype=torch.float64)
    with Capture(str(tmp_path)):
        y = x * 2  # saved whole: its storage is on file
        with Tool.quiet(), torch.no_grad():
            y.mul_(3)
        y[2:5].sum()
    d = Dump.open(str(tmp_path))
    rec = [r for r in d.op_records if r["op"] == "aten::sum"][-1]
    assert torch.equal(d.load(rec)["args"][0], (x * 6)[2:5])


def test_tensors_in_finds_the_tensors_pytree_finds_in_its_order():
    """Capture's walk of an op's arguments and outputs against torch's pytree (the reference):
    the same tensor objects, in the same order, through tuples, lists, dicts, named tuples and
    torch's return types."""
    import collections

    from torch.utils._pytree import tree_leaves

    from ditorch_precision.dump import tensors_in

    a, b, c = torch.ones(1), torch.zeros(2), torch.ones(3)
    pair = collections.namedtuple("pair", "x y")
    for tree in (((a, [b, {"k": c, "j": a}]), {"z": b, "a": c}), (pair(c, a), torch.Size([2, 3]), 3, None, "s"),
                 torch.max(torch.randn(3, 4), 1), collections.OrderedDict(q=b, r=(c, a)), a, [], {}):
        expected = [t for t in tree_leaves(tree) if isinstance(t, torch.Tensor)]
        got = tensors_in(tree)
        assert len(got) == len(expected) and all(x is y for x, y in zip(got, expected)), tree
