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
