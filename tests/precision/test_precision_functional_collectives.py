"""Functional collectives (``torch.distributed._functional_collectives``: what DTensor, tensor
parallelism and torch.compile'd code call) under a stats capture, through both op hooks. Their
result comes back before the collective completed, wrapped in an ``AsyncCollectiveTensor`` that
has no storage of its own: each hook reads it only once it is there, writes "reduce_op" and
"group" as for the dispatcher's c10d ops, and the two hooks write the same lines. One process,
a 1-rank gloo group (loopback, in-process store); the reference statistics are float64 torch over
the values the program computed without any capture (a 1-rank SUM or MAX is its input)."""
import json
import os

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from ditorch_precision import Capture, native
from ditorch_precision.dump import Dump, tensors_in

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.skipif(not native.available(), reason=f"C++ module not built: {native.why_not()}")]


@pytest.fixture
def world():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


class _RowParallel(torch.nn.Module):
    """A row-parallel linear: its output is the all-reduced partial sum, an AsyncCollectiveTensor."""

    def __init__(self, group) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(6, 4)
        self.group = group

    def forward(self, x):
        return funcol.all_reduce(self.lin(x), "sum", self.group)


def _program(cap, model, x, group) -> None:
    for _ in range(2):
        y = model(x)
        head = y.view(-1)[:5]  # a view and a slice of the wrapper: wrappers too
        g = funcol.all_gather_single(x, 0, group)
        r = funcol.reduce_scatter_single(x * 3, "sum", 0, group)
        m = funcol.wait_tensor(torch.ops._c10d_functional.all_reduce(x, "max", group.group_name))
        (y * 2).sum() + head.sum() + g.sum() + r.sum() + m.sum()
        cap.step()


def _capture(path: str, hook: str, group) -> list[dict]:
    torch.manual_seed(0)
    model, x = _RowParallel(group), torch.randn(3, 6)
    with torch.no_grad(), Capture(path, mode="stats", hook=hook) as cap:
        _program(cap, model, x, group)
    assert cap.hook_used == hook
    with open(os.path.join(path, "index.jsonl")) as f:
        return [json.loads(line) for line in f]


def _float64_stats(t: torch.Tensor) -> dict:
    x = t.double()
    return {"min": float(x.min()), "max": float(x.max()), "mean": float(x.mean()), "norm": float(x.norm())}


def _assert_stats(record: dict, want: dict) -> None:
    (s,) = record["stats"]
    assert (s["min"], s["max"]) == (want["min"], want["max"]), record["op"]
    assert s["mean"] == pytest.approx(want["mean"], rel=1e-12, abs=1e-15), record["op"]
    assert s["norm"] == pytest.approx(want["norm"], rel=1e-12), record["op"]


def test_both_hooks_record_functional_collectives_once_complete_and_write_the_same_lines(tmp_path, world):
    cpp = _capture(str(tmp_path / "cpp"), "cpp", world)
    python = _capture(str(tmp_path / "python"), "python", world)
    assert [r["op"] for r in cpp] == [r["op"] for r in python]
    for a, b in zip(cpp, python):
        assert a == b
    # what the program computes, without a capture (1 rank: the reductions are the identity)
    torch.manual_seed(0)
    model, x = _RowParallel(world), torch.randn(3, 6)
    with torch.no_grad():
        partial = model.lin(x)
    step0 = [r for r in cpp if r["step"] == 0]
    ops = [r["op"] for r in step0]
    # the functional ops themselves, not the c10d calls and copies inside their kernels
    assert not any(op.startswith("c10d::") for op in ops)
    assert ops.count("_c10d_functional::all_reduce") == 2
    assert "_c10d_functional::all_gather_into_tensor" in ops and "_c10d_functional::reduce_scatter_tensor" in ops
    by_op = {}
    for r in step0:
        by_op.setdefault(r["op"], []).append(r)
    total, maximum = by_op["_c10d_functional::all_reduce"]
    assert (total["reduce_op"], total["group"]) == ("SUM", [0])
    assert (maximum["reduce_op"], maximum["group"]) == ("MAX", [0])
    gathered = by_op["_c10d_functional::all_gather_into_tensor"][0]
    assert (gathered["reduce_op"], gathered["group"]) == (None, [0])
    assert by_op["_c10d_functional::reduce_scatter_tensor"][0]["reduce_op"] == "SUM"
    _assert_stats(total, _float64_stats(partial))
    _assert_stats(maximum, _float64_stats(x))
    _assert_stats(gathered, _float64_stats(x))
    _assert_stats(by_op["_c10d_functional::reduce_scatter_tensor"][0], _float64_stats(x * 3))
    # the wrapper the program holds, its module record and a slice of it read the same elements
    wrapped = by_op["_c10d_functional::_wrap_tensor_autograd"][0]
    _assert_stats(wrapped, _float64_stats(partial))
    module = next(r for r in step0 if r["op"] == "module::output" and r["module"] == "_RowParallel")
    _assert_stats(module, _float64_stats(partial))
    _assert_stats(by_op["aten::slice"][0], _float64_stats(partial.view(-1)[:5]))


def _saved(path: str, hook: str, group) -> list[tuple[str, list, list]]:
    """A full capture of ``_program``: per op record, (op, tensors of its arguments, of its outputs)."""
    torch.manual_seed(0)
    model, x = _RowParallel(group), torch.randn(3, 6)
    with torch.no_grad(), Capture(path, mode="full", hook=hook) as cap:
        _program(cap, model, x, group)
    assert cap.hook_used == hook
    d = Dump.open(path)
    return [(r["op"], tensors_in((data["args"], data["kwargs"])), tensors_in(data["outputs"]))
            for r, data in ((r, d.load(r)) for r in d.op_records)]


def test_a_full_capture_saves_the_elements_a_wrapper_holds_through_both_hooks(tmp_path, world):
    """A functional collective's result (an AsyncCollectiveTensor, without storage of its own) as an
    op's argument or output: both hooks save the plain tensor it wraps, once waited for."""
    cpp = _saved(str(tmp_path / "cpp"), "cpp", world)
    python = _saved(str(tmp_path / "python"), "python", world)
    assert [op for op, _, _ in cpp] == [op for op, _, _ in python]
    for (op, args_c, outs_c), (_, args_p, outs_p) in zip(cpp, python):
        assert (len(args_c), len(outs_c)) == (len(args_p), len(outs_p)), op
        for got, want in zip(args_c + outs_c, args_p + outs_p):
            torch.testing.assert_close(got, want, rtol=0, atol=0, msg=op)
    torch.manual_seed(0)  # 1 rank: the row-parallel sum is the partial product, computed without a capture
    model, x = _RowParallel(world), torch.randn(3, 6)
    with torch.no_grad():
        partial = model.lin(x)
    summed = next(outs for op, _, outs in cpp if op == "_c10d_functional::all_reduce")
    torch.testing.assert_close(summed[0], partial, rtol=0, atol=0)
    # the wrapper as an argument: the view of the program's ``y.view(-1)``
    (viewed,) = next(args for op, args, _ in cpp if op == "aten::view")
    torch.testing.assert_close(viewed, partial, rtol=0, atol=0)


def _autograd_capture(path: str, hook: str, group) -> list[dict]:
    torch.manual_seed(0)
    x = torch.randn(4, 3, requires_grad=True)
    with Capture(path, mode="stats", hook=hook):
        y = funcol.all_gather_tensor_autograd(x * 2, 0, group)
        z = funcol.reduce_scatter_tensor_autograd(y, "sum", 0, group)
        (z.sum() + y.sum()).backward()
    with open(os.path.join(path, "index.jsonl")) as f:
        return [json.loads(line) for line in f]


def test_the_autograd_variants_are_recorded_alike_forward_and_backward(tmp_path, world):
    cpp = _autograd_capture(str(tmp_path / "cpp"), "cpp", world)
    assert cpp == _autograd_capture(str(tmp_path / "python"), "python", world)
    backward = [r["op"] for r in cpp if r["phase"] == "backward" and r["op"].startswith("_c10d_functional::")]
    assert backward == ["_c10d_functional::all_gather_into_tensor", "_c10d_functional::wait_tensor",
                        "_c10d_functional::reduce_scatter_tensor", "_c10d_functional::wait_tensor"]
    # 1 rank: the gradient of x is 2 x (1 + 1), both sums' gradients gathered and scattered back
    (s,) = [r for r in cpp if r["op"] == "aten::mul" and r["phase"] == "backward"][-1]["stats"]
    assert (s["min"], s["max"], s["numel"]) == (4.0, 4.0, 12)


@pytest.mark.parametrize("hook", ["cpp", "python"])
def test_a_group_made_in_the_middle_of_a_step_is_written_with_its_ranks(tmp_path, world, hook):
    """The C++ hook is handed the groups torch.distributed knows at entry and at each step; one
    made between them is asked of Python when a collective first names it."""
    x = torch.ones(4)
    with torch.no_grad(), Capture(str(tmp_path), mode="stats", hook=hook):
        pair = dist.new_group([0])
        dist.all_reduce(x, group=pair)
        funcol.all_reduce(x, "sum", pair).wait()
    with open(tmp_path / "index.jsonl") as f:
        records = [json.loads(line) for line in f]
    named = [(r["op"], r["group"]) for r in records if r["op"] in ("c10d::allreduce_", "_c10d_functional::all_reduce")]
    assert named == [("c10d::allreduce_", [0]), ("_c10d_functional::all_reduce", [0])]


@pytest.fixture(scope="module")
def tp_job(tmp_path_factory, launch_gloo):
    """A real 2-process gloo job (loopback): ditorch_precision.examples.dist_functional, each op
    hook honest and with layer ``down``'s mm 1e-4 off on rank 1."""
    root = tmp_path_factory.mktemp("funcol")
    launch_gloo("ditorch_precision.examples.dist_functional", root, 2, "--fault-rank", "1")
    return root


def _index(root, hook: str, run: str, rank: int) -> list[dict]:
    with open(root / hook / run / "capture" / f"rank{rank}" / "index.jsonl") as f:
        return [json.loads(line) for line in f]


def _without_group_name(record: dict) -> dict:
    """A functional collective names its group by a process-wide counter (another in each run of
    the job's four); the group's ranks ("group") are what is compared."""
    if record["op"].startswith("_c10d_functional::") and "signature" in record:
        record = {**record, "signature": {k: v for k, v in record["signature"].items() if k != "group_name"}}
    return record


def test_a_tensor_parallel_job_is_recorded_alike_by_both_hooks_with_mid_step_groups(tp_job):
    from ditorch_precision.examples.dist_functional import TPFeedForward

    for run in ("ref", "fault"):
        for rank in (0, 1):
            cpp, python = _index(tp_job, "cpp", run, rank), _index(tp_job, "python", run, rank)
            assert len(cpp) == len(python) > 80
            for a, b in zip(cpp, python):
                assert _without_group_name(a) == _without_group_name(b)
    records = _index(tp_job, "cpp", "ref", 0)
    step0 = [r for r in records if r["step"] == 0]
    collectives = [(r["op"], r["reduce_op"], r["group"]) for r in step0 if "reduce_op" in r
                   and not r["op"].endswith(("wait_tensor", "_wrap_tensor_autograd"))]
    assert collectives == [
        ("_c10d_functional::all_reduce", "SUM", [0, 1]),  # the row-parallel sum
        ("_c10d_functional::all_gather_into_tensor", None, [0, 1]),
        ("_c10d_functional::reduce_scatter_tensor", "AVG", [0, 1]),
        ("c10d::allreduce_", "SUM", [0, 1]),  # on the group made in the middle of the step
        ("_c10d_functional::all_reduce", "MAX", [0, 1]),
    ]
    # The row-parallel sum against the unsharded layer in float64 in this process.
    full = TPFeedForward(0, 1, None).double()
    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(1)).double()
    with torch.no_grad():
        want = _float64_stats(torch.nn.functional.gelu(x.mm(full.up.t())).mm(full.down.weight.t()))
    (s,) = next(r for r in step0 if r["op"] == "_c10d_functional::all_reduce")["stats"]
    for key in ("min", "max", "mean", "norm"):
        assert s[key] == pytest.approx(want[key], rel=1e-5, abs=1e-6), key
    # The in-place all-reduce of the loss (the same on both ranks) is read once it completed: twice
    # the copy it sums, not the copy's statistics again.
    at = next(i for i, r in enumerate(step0) if r["op"] == "c10d::allreduce_")
    assert step0[at - 1]["op"] == "aten::clone"
    assert step0[at]["stats"][0]["max"] == 2 * step0[at - 1]["stats"][0]["max"]


@pytest.mark.parametrize("hook", ["cpp", "python"])
def test_the_fault_on_rank_1_is_found_and_rank_0_stays_clean(tp_job, hook, capsys):
    """Rank 1's error reaches rank 0 through the row-parallel all-reduce: rank 0's ops after it
    differ (drift), none of them fails; the first divergence is the planted mm on rank 1."""
    from ditorch_precision.cli import main

    assert main(["compare", str(tp_job / hook / "fault"), str(tp_job / hook / "ref"), "--json"]) == 1
    d = json.loads(capsys.readouterr().out)
    assert [r for r in d["per_rank"]["0"]["ops"] if r["status"] == "fail"] == []
    assert d["per_rank"]["0"]["n_drift"] > 0
    assert [r for r in d["per_rank"]["1"]["ops"] if r["status"] == "fail"]
    fd = d["first_divergence"]
    assert (fd["rank"], fd["op"], fd["module"], fd["step"]) == (1, "aten::mm", "TPFeedForward.down", 0)
