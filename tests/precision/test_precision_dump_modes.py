"""Statistics-only and checksum captures of a HuggingFace Llama training run (CPU float32 standing in
for the device), autocompare's saved inputs of failing ops, and replay forward + backward with
timing. References: plain torch on the full capture's tensors, and a planted 1e-4 fault."""
import json
import os

import pytest
import torch

from ditorch_precision import AutoCompare, Capture, Selector, compare_dumps
from ditorch_precision.selection import SelectionError
from ditorch_precision.cli import main
from ditorch_precision.align import INPUTS_OP
from ditorch_precision.dump import Dump
from ditorch_precision.examples.faults import wrong_kernel
from ditorch_precision.examples.hf_llama import HFLlamaSize, hf_batches, hf_train, make_hf_llama

from stats_reference import assert_stats_are_float64_of

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")

SIZE = HFLlamaSize()
FAULTY = "LlamaForCausalLM.model.layers.0.mlp.down_proj"
STEPS = 3


def _run(path, mode, fault=False, hook="auto"):
    torch.set_num_threads(1)
    model = make_hf_llama(SIZE)
    plant = wrong_kernel("mm", 1 + 1e-4 if fault else 1.0, inside=model.model.layers[0].mlp.down_proj)
    with plant, Capture(str(path), mode=mode, hook=hook):
        hf_train(model, hf_batches(SIZE, STEPS))
    return str(path)


def _dir_bytes(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    root = tmp_path_factory.mktemp("modes")
    # "stats_py": the Python op hook (the full capture's, "auto", is the C++ one where it is built: both
    # number the same ops)
    return {name: _run(root / name, mode, fault, hook) for name, mode, fault, hook in (
        ("full", "full", False, "auto"), ("stats", "stats", False, "auto"), ("stats2", "stats", False, "auto"),
        ("stats_py", "stats", False, "python"), ("stats_bad", "stats", True, "auto"),
        ("sum", "checksum", False, "auto"), ("sum2", "checksum", False, "auto"),
        ("sum_bad", "checksum", True, "auto"))}


def test_stats_capture_is_small_and_holds_the_right_numbers(dumps):
    full, stats = Dump.open(dumps["full"]), Dump.open(dumps["stats_py"])
    assert not os.listdir(os.path.join(dumps["stats"], "tensors"))
    # (the full capture writes each tensor once, views as references: about 5x here, through either
    # hook since both copy only what an in-place op writes; the gap grows with sizes)
    assert _dir_bytes(dumps["stats"]) * 4 < _dir_bytes(dumps["full"])
    # the same records, but what each optimizer step starts from, which only a full capture keeps (a replay's)
    starts = [r["step"] for r in full.records if r["op"] == INPUTS_OP]
    assert starts == list(range(STEPS)) and not any(r["op"] == INPUTS_OP for r in stats.records)
    assert len(stats.records) == len(full.records) - STEPS and {r["step"] for r in stats.records} >= set(range(STEPS))
    for rf, rs in list(zip(full.op_records, stats.op_records))[::37]:
        outs = [t for t in torch.utils._pytree.tree_leaves(full.load(rf)["outputs"]) if isinstance(t, torch.Tensor)]
        for t, s in zip(outs, rs["stats"]):
            if t.is_floating_point() and t.numel():
                x = t.double()
                assert s["max"] == pytest.approx(float(x.max())) and s["min"] == pytest.approx(float(x.min()))
                assert s["mean"] == pytest.approx(float(x.mean()), rel=1e-9, abs=1e-12)
                assert s["norm"] == pytest.approx(float(x.norm()), rel=1e-9)


def test_stats_compare_names_the_planted_mm_first(dumps):
    assert compare_dumps(dumps["stats2"], dumps["stats"]).passed
    report = compare_dumps(dumps["stats_bad"], dumps["stats"])
    fd = report.first_divergence
    assert (fd["op"], fd["module"], fd["rule"]) == ("aten::mm", FAULTY, "stats")


def test_checksum_compare_is_bitwise(dumps, capsys):
    assert main(["compare", dumps["sum2"], dumps["sum"]]) == 0
    capsys.readouterr()
    assert main(["compare", dumps["sum_bad"], dumps["sum"], "--json"]) == 1
    fd = json.loads(capsys.readouterr().out)["first_divergence"]
    assert (fd["op"], fd["module"], fd["rule"]) == ("aten::mm", FAULTY, "checksum")


def test_autocompare_saves_failing_inputs_and_replay_runs_forward_backward(tmp_path, capsys):
    model = make_hf_llama(SIZE)
    with wrong_kernel("mm", 1 + 1e-4, inside=model.model.layers[0].mlp.down_proj):
        with AutoCompare(save_failures=str(tmp_path / "fail")) as ac:
            hf_train(model, hf_batches(SIZE, 1))
    assert [f["op"] for f in ac.failures] == ["aten::mm"]
    dump = Dump.open(str(tmp_path / "fail"))
    assert [r["op"] for r in dump.records] == ["aten::mm"]
    data = dump.load(dump.records[0])
    a, b = data["args"]
    honest = a.double() @ b.double()  # plain torch on the saved inputs: the fault is what is left
    rel = ((data["outputs"].double() - honest).abs().max() / honest.abs().max()).item()
    assert 0.3e-4 < rel < 3e-4
    index = dump.records[0]["index"]
    assert main(["replay", str(tmp_path / "fail"), str(index), "--dtype", "float64", "--backward", "--repeat", "3",
                 "--json"]) == 1  # the saved (faulty) output against an honest float64 replay
    d = json.loads(capsys.readouterr().out)
    assert d["passed"] is False and d["backward"]["passed"] is True  # backward of mm on the CPU is honest
    assert d["timing"]["repeat"] == 3 and d["timing"]["forward_ms"] > 0 and d["timing"]["forward_backward_ms"] > 0


def test_ops_carry_their_torch_level_call_and_can_be_selected_by_it(tmp_path):
    model = make_hf_llama(SIZE)
    n_linear = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    with Capture(str(tmp_path / "c"), Selector.build(apis="F.linear", phases="forward")):
        hf_train(model, hf_batches(SIZE, 1))
    records = Dump.open(str(tmp_path / "c")).op_records
    assert records and all(r["api"] == "torch.nn.functional.linear" for r in records)
    assert sum(r["op"] == "aten::mm" for r in records) == n_linear  # one matmul per nn.Linear call
    model = make_hf_llama(SIZE)
    with wrong_kernel("mm", 1 + 1e-4, inside=model.model.layers[0].mlp.down_proj):
        with AutoCompare(with_api=True) as ac:
            hf_train(model, hf_batches(SIZE, 1))
    assert [(f["op"], f["api"]) for f in ac.failures] == [("aten::mm", "torch.nn.functional.linear")]
    with pytest.raises(SelectionError, match="closest: .*linear"):
        with Capture(str(tmp_path / "d"), Selector.build(apis="F.linearr")):
            hf_train(make_hf_llama(SIZE), hf_batches(SIZE, 1))


def _dropout_checksums(path, seed: int) -> str:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Dropout(0.5))
    torch.manual_seed(seed)  # the draws
    with Capture(str(path), mode="checksum"):
        model(torch.ones(4, 8))
    return str(path)


def test_checksum_captures_tell_whether_two_runs_drew_the_same_numbers(tmp_path):
    """One seed, then another: plain torch's masks are equal, then not; the compare's random-op row
    says so from the hashes alone."""
    masks = []
    for seed in (1, 1, 2):
        torch.manual_seed(seed)
        masks.append(torch.empty(4, 64).bernoulli_(0.5))
    assert torch.equal(masks[0], masks[1]) and not torch.equal(masks[0], masks[2])
    a, b, c = (_dropout_checksums(tmp_path / name, seed) for name, seed in (("a", 1), ("b", 1), ("c", 2)))
    for other, same in ((b, True), (c, False)):
        draws = [r for r in compare_dumps(a, other).ops if r.get("same_draws") is not None]
        assert [(r["op"], r["same_draws"]) for r in draws] == [("aten::bernoulli_", same)]


class _Attention(torch.nn.Module):
    def forward(self, q):
        return torch.nn.functional.dropout(torch.nn.functional.scaled_dot_product_attention(q, q, q), 0.5)


def test_a_capture_marks_which_random_ops_drew(tmp_path):
    """SDPA's CPU kernel is tagged random but draws nothing with dropout_p 0; the dropout after it
    draws. Without saved arguments (a stats capture) the compare goes by these marks: only the
    dropout's row is a draw, and with one seed in both runs its statistics are the same numbers: the
    same draws."""
    q = torch.randn(1, 2, 4, 8)
    for name in ("a", "b"):
        torch.manual_seed(0)
        with Capture(str(tmp_path / name), mode="stats"):
            _Attention()(q)
    marks = {r["op"]: r.get("random") for r in Dump.open(str(tmp_path / "a")).op_records}
    assert marks["aten::_scaled_dot_product_flash_attention_for_cpu"] is False and marks["aten::bernoulli_"] is True
    assert aten_tagged_random("_scaled_dot_product_flash_attention_for_cpu")
    rows = compare_dumps(str(tmp_path / "a"), str(tmp_path / "b")).ops
    assert [(r["op"], r["same_draws"]) for r in rows if "same_draws" in r] == [("aten::bernoulli_", True)]


def aten_tagged_random(name: str) -> bool:
    return torch.Tag.nondeterministic_seeded in getattr(torch.ops.aten, name).default.tags


def test_tensor_stats_against_float64_on_nonfinite_integer_and_16_bit_tensors():
    """The statistics of a stats capture (one aminmax, a float64 copy's sum and dot product) against
    plain float64 torch over the finite values, with NaN/Inf counted apart."""
    from ditorch_precision.summaries import tensor_stats

    g = torch.Generator().manual_seed(0)
    base = torch.randn(1000, generator=g) * 3
    with_nan = base.clone()
    with_nan[[3, 500]] = float("nan")
    with_nan[7] = float("-inf")
    for t, nan, inf in ((base, 0, 0), (with_nan, 2, 1), (base.bfloat16(), 0, 0), (torch.arange(-5, 9), 0, 0),
                        (torch.full((4,), float("inf")), 0, 4)):
        s = tensor_stats(t)
        assert (s["nan"], s["inf"], s["numel"]) == (nan, inf, t.numel())
        x = t.double()
        x = x[x.isfinite()]
        if not x.numel():
            assert "mean" not in s
            continue
        assert (s["min"], s["max"]) == (float(x.min()), float(x.max()))
        assert s["mean"] == pytest.approx(float(x.mean()), rel=1e-12, abs=1e-15)
        assert s["norm"] == pytest.approx(float(x.norm()), rel=1e-12)


def _stats_program() -> None:
    """Views of tensors before and after in-place writes, and module outputs that are op outputs."""
    torch.manual_seed(0)
    x = torch.randn(6, 8)
    y = x.t()
    x.mul_(2)  # y's values change with x's: a view taken now must not reuse what was computed before
    z = y.reshape(48).unsqueeze(0)
    x.add_(1)
    torch.nn.functional.relu(z.transpose(0, 1).detach())
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Tanh())
    model(x.view(2, 3, 8)).sum().backward()


def test_stats_capture_views_and_module_records_against_float64_of_the_full_capture(tmp_path):
    """A stats capture reuses statistics it computed (views holding their input's elements, a
    module's output that is an op's output): every record's statistics against float64 torch over
    the tensors a full capture of the same program saved at that op. (The Python op hook; the C++
    hook's is in test_precision_native.)"""
    with Capture(str(tmp_path / "stats"), mode="stats", hook="python"):
        _stats_program()
    with Capture(str(tmp_path / "full")):
        _stats_program()
    stats, full = Dump.open(str(tmp_path / "stats")), Dump.open(str(tmp_path / "full"))
    assert [(r["index"], r["op"]) for r in stats.records] == [(r["index"], r["op"]) for r in full.records]
    ops = set()
    for rs, rf in zip(stats.records, full.records):
        if rs.get("unwritten"):  # leftovers of an empty* count as 0 there (test_precision_unwritten)
            continue
        assert_stats_are_float64_of(rs, rf, full)
        ops.add(rs["op"])
    assert {"aten::t", "aten::view", "aten::unsqueeze", "aten::transpose", "module::output"} <= ops
