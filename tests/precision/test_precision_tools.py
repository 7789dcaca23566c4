"""The live tools on a small LLaMA-style model trained on the CPU (CPU float32/float16 stand in for
the device, CPU float64 is the reference): selection, module paths, phases, autocompare, overflow,
timing, dtype casting and fallback, and that each leaves torch as it found it."""
import json

import pytest
import torch
import torch.nn.modules.module as nn_module
import torch.optim.optimizer as optim_hooks

from ditorch_precision import AutoCompare, Capture, DtypeCast, Dump, Fallback, OpTimer, OverflowCheck, Selector
from ditorch_precision.examples.faults import wrong_kernel
from ditorch_precision.examples.tiny_llama import LlamaConfig, make_model, train
from program_ops import OpLog

CFG = LlamaConfig(dim=32, hidden=64, heads=4, seq=8, batch=2, layers=2)


pytestmark = pytest.mark.usefixtures("one_thread")


def _torch_state():
    return (torch._C._len_torch_dispatch_stack(), len(nn_module._global_forward_pre_hooks),
            len(nn_module._global_forward_hooks), len(optim_hooks._global_optimizer_pre_hooks),
            len(optim_hooks._global_optimizer_post_hooks))


@pytest.mark.parametrize("make", [
    lambda p: Capture(str(p / "c")), lambda p: AutoCompare(), lambda p: OverflowCheck(), lambda p: OpTimer(),
    lambda p: DtypeCast(), lambda p: Fallback()])
def test_every_tool_leaves_torch_as_it_found_it(tmp_path, make):
    before = _torch_state()
    with pytest.raises(ZeroDivisionError):
        with make(tmp_path):
            assert _torch_state() != before
            torch.ones(2).add_(1)
            raise ZeroDivisionError("the block's own error")
    assert _torch_state() == before


def test_capture_selection_module_paths_phases_and_steps(tmp_path):
    sel = Selector.build(modules="layers.1.mlp", steps="1")
    with Capture(str(tmp_path / "c"), sel):
        train(2, CFG, optimizer="sgd")
    recs = [json.loads(line) for line in open(tmp_path / "c" / "index.jsonl")]
    assert recs and all(r["step"] == 1 for r in recs)
    assert all(r["module"].startswith("TinyLlama.layers.1.mlp") for r in recs)
    phases = {r["phase"] for r in recs}
    assert phases == {"forward", "backward"}
    fwd_modules = {r["module"] for r in recs if r["phase"] == "forward"}
    assert {"TinyLlama.layers.1.mlp", "TinyLlama.layers.1.mlp.w1", "TinyLlama.layers.1.mlp.w2"} <= fwd_modules
    ops = {(r["phase"], r["op"]) for r in recs}
    assert ("forward", "aten::silu") in ops and ("backward", "aten::silu_backward") in ops
    silu_bwd = [r for r in recs if r["op"] == "aten::silu_backward"]
    assert silu_bwd[0]["module"] == "TinyLlama.layers.1.mlp"
    dump = Dump.open(str(tmp_path / "c"))
    assert all(dump.load(r) is not None for r in recs)  # every record's tensors are there (some by reference)
    data = dump.load(silu_bwd[0])
    grad_out, x = data["args"]
    # the captured gradient is the real one: silu'(x) * grad_out
    sig = torch.sigmoid(x)
    torch.testing.assert_close(data["outputs"], grad_out * sig * (1 + x * (1 - sig)))


def test_capture_size_cap_and_callsite(tmp_path):
    with Capture(str(tmp_path / "c"), Selector.build(ops="aten::mm"), max_bytes=20_000, with_callsite=True) as c:
        train(1, CFG, optimizer="sgd")
    recs = [json.loads(line) for line in open(tmp_path / "c" / "index.jsonl")]
    meta = json.load(open(tmp_path / "c" / "meta.json"))
    assert {r["op"] for r in recs} == {"aten::mm"}
    assert meta["bytes_written"] <= 20_000 and meta["n_dropped"] > 0 and c.n_dropped == meta["n_dropped"]
    assert any(r["file"] is None for r in recs) and any(r["file"] for r in recs)
    assert any("tiny_llama.py" in (r["callsite"] or "") for r in recs)


def test_autocompare_honest_run_has_no_failure_and_sees_backward():
    with AutoCompare() as ac:
        train(1, CFG, optimizer="sgd")
    assert ac.failures == []
    phases = {r["phase"] for r in ac.results if r["status"] == "pass"}
    assert {"forward", "backward", "optimizer"} <= phases
    assert ac.summary()["n_compared"] > 200


def test_autocompare_finds_the_planted_op_first():
    with OpLog() as log:
        train(1, CFG, optimizer="sgd")
    first_silu = log.ops.index("aten::silu")
    with wrong_kernel("silu"):
        with AutoCompare() as ac:
            train(1, CFG, optimizer="sgd")
    fails = ac.failures
    assert fails and fails[0]["op"] == "aten::silu" and fails[0]["index"] == first_silu
    assert {f["op"] for f in fails} == {"aten::silu"}
    assert fails[0]["module"] == "TinyLlama.layers.0.mlp" and fails[0]["rule"] == "allclose"


def test_autocompare_without_sync_gives_the_same_verdicts():
    with wrong_kernel("silu"):
        with AutoCompare(Selector.build(ops="silu,mm")) as sync:
            train(1, CFG, optimizer="sgd")
        with AutoCompare(Selector.build(ops="silu,mm"), sync=False) as nosync:
            train(1, CFG, optimizer="sgd")
    key = lambda rows: [(r["index"], r["op"], r["status"]) for r in rows]  # noqa: E731
    assert key(sync.results) == key(nosync.results) and sync.failures


def test_overflow_check_finds_the_planted_inf():
    torch.manual_seed(0)
    model = make_model(CFG)
    with torch.no_grad():
        w = model.layers[1].mlp.w1.weight
        w.copy_(torch.sign(w) * 3e38)  # finite, but its matmul overflows float32
    tokens = torch.randint(0, CFG.vocab, (CFG.batch, CFG.seq))
    with OverflowCheck() as oc:
        model(tokens).sum().backward()
    first = oc.first
    assert first.op == "aten::mm" and first.module == "TinyLlama.layers.1.mlp.w1" and first.phase == "forward"
    assert first.kind == "inf" and first.inputs_finite
    assert any("test_precision_tools.py" in frame for frame in first.stack)
    # the causal mask's -inf (a scalar given to masked_fill) was not taken for an overflow
    assert all(e.op != "aten::masked_fill" for e in oc.events)
    with OverflowCheck(Selector.build(modules="layers.0")) as clean:
        model(tokens)
    assert clean.first is None


def test_overflow_range_dtype_flags_values_beyond_float16():
    with OverflowCheck(range_dtype=torch.float16) as oc:
        torch.full((3,), 1e4) * 10  # 1e4 fits float16, 1e5 does not
    assert oc.first.kind == "range" and oc.first.op == "aten::mul"


def test_op_timer_counts_every_op():
    with OpLog() as log:
        train(1, CFG, optimizer="sgd")
    with OpTimer() as t:
        train(1, CFG, optimizer="sgd")
    counts = {e.op: e.count for e in t.times.values()}
    expected = {}
    for op in log.ops:
        if not op.startswith("profiler::"):
            expected[op] = expected.get(op, 0) + 1
    assert counts == expected
    assert "aten::mm" in t.table(50) and len(t.top(5)) == 5


def test_dtype_cast_runs_wider_and_restores_dtype():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(32, 64, generator=g).half(), torch.randn(64, 16, generator=g).half()
    with DtypeCast(Selector.build(ops="mm")) as cast:
        out = a @ b
        acc = torch.zeros(4, dtype=torch.float16)
        acc.add_(torch.full((4,), 0.1, dtype=torch.float16))  # in-place: not selected, stays float16
    assert out.dtype == torch.float16 and cast.counts["aten::mm"] == 1
    torch.testing.assert_close(out, (a.float() @ b.float()).half(), rtol=0, atol=0)
    with DtypeCast(Selector.build(ops="add_")):
        acc2 = torch.zeros(4, dtype=torch.float16)
        res = acc2.add_(torch.full((4,), 0.1, dtype=torch.float16))
    assert res is acc2 and acc2.dtype == torch.float16
    torch.testing.assert_close(acc2, torch.full((4,), 0.1, dtype=torch.float16))


def test_fallback_restores_device_and_in_place_results():
    x = torch.randn(5)
    with Fallback(Selector.build(ops="mul,add_")) as fb:
        y = x * 2
        z = torch.zeros(5)
        r = z.add_(x)
    assert y.device == x.device and y.dtype == x.dtype and torch.equal(y, x * 2)
    assert r is z and torch.equal(z, x)
    assert fb.counts == {"aten::mul": 1, "aten::add_": 1}
