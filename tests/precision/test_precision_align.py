"""Structural alignment on a HuggingFace LlamaForCausalLM (random weights, AdamW, CPU float32 standing
in for the device): the run under test takes another attention implementation (sdpa's fused CPU
flash kernel against eager matmul/softmax) or runs an inserted op, and carries one planted fault
after them; the report names the planted op (or its module) and nothing else, and lists the
unmatched ops. The reference for "where the fault is" is where the test planted it."""
import json
from contextlib import nullcontext

import pytest
import torch

from ditorch_precision import Capture, compare_dumps
from ditorch_precision.align import Equivalences, align
from ditorch_precision.cli import main
from ditorch_precision.diff import CompareOptions
from ditorch_precision.dump import Dump
from ditorch_precision.examples.faults import wrong_kernel
from ditorch_precision.examples.hf_llama import HFLlamaSize, hf_batches, hf_train, make_hf_llama

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")

SIZE = HFLlamaSize()
ROOT = "LlamaForCausalLM.model.layers"


def _capture(path, attn="eager", fault=None, insert=False, second=None):
    torch.set_num_threads(1)
    model = make_hf_llama(SIZE, attn)
    if insert:  # one extra op inside layers.0.mlp: its input times 1.0
        model.model.layers[0].mlp.register_forward_pre_hook(lambda mod, args: (args[0] * 1.0,))
    plant = wrong_kernel(fault[0], fault[1], inside=fault[2](model)) if fault else nullcontext()
    plant_second = wrong_kernel(second[0], second[1], inside=second[2](model)) if second else nullcontext()
    with plant, plant_second, Capture(str(path)):
        hf_train(model, hf_batches(SIZE, 1))
    return str(path)


MM_IN_LAYER_1 = ("mm", 1 + 1e-4, lambda m: m.model.layers[1].mlp.down_proj)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("align")
    return {
        "eager": _capture(root / "eager"),
        "sdpa": _capture(root / "sdpa", "sdpa"),
        "sdpa_fault": _capture(root / "sdpa_fault", "sdpa", MM_IN_LAYER_1),
        "insert_fault": _capture(root / "insert_fault", "eager", MM_IN_LAYER_1, insert=True),
        "eager_bad_attention": _capture(root / "eager_bad_attn", "eager",
                                        ("bmm", 1 + 1e-3, lambda m: m.model.layers[0].self_attn)),
        # a fault in layer 0's mlp, and a second one in a region after it (layer 1's eager attention)
        "two_faults": _capture(root / "two_faults", "eager", ("silu", 1 + 1e-3, lambda m: m.model.layers[0].mlp.act_fn),
                               second=("bmm", 1 + 1e-3, lambda m: m.model.layers[1].self_attn)),
    }


def _failed(report):
    return [(r["op"], r["module"], r["phase"]) for r in report.failed]


def test_the_attention_implementations_really_differ_in_ops(runs):
    ops = {k: {r["op"] for r in Dump.open(runs[k]).op_records} for k in ("eager", "sdpa")}
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in ops["sdpa"] - ops["eager"]
    assert {"aten::_softmax", "aten::bmm"} <= ops["eager"] - ops["sdpa"]


def test_honest_runs_with_different_attention_pass(runs):
    report = compare_dumps(runs["sdpa"], runs["eager"])
    assert report.passed, _failed(report)
    assert {(r["module"], r["phase"]) for r in report.regions} >= {
        (f"{ROOT}.0.self_attn", "forward"), (f"{ROOT}.0.self_attn", "backward")}
    judged = [r for r in report.ops if r["op"].startswith("module::")]
    assert judged and all(r["status"] == "pass" for r in judged)


def test_index_alignment_fails_at_the_first_attention(runs):
    report = compare_dumps(runs["sdpa"], runs["eager"], options=CompareOptions(align="index"))
    assert not report.passed and report.first_divergence["rule"] == "alignment"


def test_sdpa_run_with_a_planted_mm_names_it_and_nothing_else(runs, capsys):
    assert main(["compare", runs["sdpa_fault"], runs["eager"], "--json"]) == 1
    d = json.loads(capsys.readouterr().out)
    assert [(r["op"], r["module"], r["phase"]) for r in d["ops"] if r["status"] == "fail"] == [
        ("aten::mm", f"{ROOT}.1.mlp.down_proj", "forward")]
    only_a = {r["op"] for r in d["unmatched"] if r["run"] == "A"}
    only_b = {r["op"] for r in d["unmatched"] if r["run"] == "B"}
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in only_a and "aten::_softmax" in only_b
    assert d["n_passed"] > 500


def test_an_inserted_op_is_unmatched_and_the_planted_mm_is_named(runs):
    report = compare_dumps(runs["insert_fault"], runs["eager"])
    assert _failed(report) == [("aten::mm", f"{ROOT}.1.mlp.down_proj", "forward")]
    assert [(r["op"], r["module"], r["phase"], r["run"]) for r in report.unmatched] == [
        ("aten::mul", f"{ROOT}.0.mlp", "forward", "A"), ("aten::mul", f"{ROOT}.0.mlp", "backward", "A")]


def test_a_fault_inside_a_differing_region_is_named(runs):
    """The faulty bmm has no partner in the sdpa run: it is judged against its own float64 replay."""
    report = compare_dumps(runs["eager_bad_attention"], runs["sdpa"])
    fd = report.first_divergence
    assert (fd["op"], fd["module"], fd["phase"]) == ("aten::bmm", f"{ROOT}.0.self_attn", "forward")
    assert {(r["op"], r["module"]) for r in report.failed} == {("aten::bmm", f"{ROOT}.0.self_attn")}
    region = next(r for r in report.regions if r["module"] == f"{ROOT}.0.self_attn" and r["phase"] == "forward")
    assert region["verdict"] == "fail"


def test_every_region_gets_a_verdict(runs):
    """Regions after the first divergence (both layers' attention backward) are judged too: their
    unmatched ops of A against their own float64 replay (the fused forward kernel is tagged random,
    for its dropout, and is replayed when its dropout_p is 0)."""
    report = compare_dumps(runs["sdpa_fault"], runs["eager"])
    by_place = {(r["module"], r["phase"]): r for r in report.regions}
    for layer in (0, 1):
        forward = by_place[(f"{ROOT}.{layer}.self_attn", "forward")]
        backward = by_place[(f"{ROOT}.{layer}.self_attn", "backward")]
        assert forward["verdict"] == backward["verdict"] == "pass", (forward, backward)
        assert forward["n_ops_checked"] >= 1 and backward["n_ops_checked"] >= 1
    # after the fault, a region judged by module records only differs by inherited drift: "drift", not "fail"
    assert {r["verdict"] for r in report.regions} <= {"pass", "drift"}


def test_a_second_fault_in_a_region_after_the_first_divergence_is_named(runs):
    report = compare_dumps(runs["two_faults"], runs["sdpa"])
    failed = _failed(report)  # the silu first; then both bmm of layer 1's attention (scores, weighted values)
    assert failed[0] == ("aten::silu", f"{ROOT}.0.mlp.act_fn", "forward")
    assert set(failed[1:]) == {("aten::bmm", f"{ROOT}.1.self_attn", "forward")}
    verdicts = {(r["module"], r["phase"]): r["verdict"] for r in report.regions}
    assert verdicts[(f"{ROOT}.1.self_attn", "forward")] == "fail"
    assert verdicts[(f"{ROOT}.0.self_attn", "forward")] == "pass"


def _addmm_capture(path, use_addmm):
    class Proj(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(4, 3))
            self.b = torch.nn.Parameter(torch.zeros(3))

        def forward(self, x):
            return torch.addmm(self.b, x, self.w) if use_addmm else x @ self.w

    torch.manual_seed(0)
    model, x = Proj(), torch.randn(2, 4)
    with Capture(str(path)):
        model(x).sum().backward()
    return str(path)


def test_the_equivalence_table_is_extended_by_a_file(tmp_path, capsys):
    a, b = _addmm_capture(tmp_path / "a", True), _addmm_capture(tmp_path / "b", False)
    ra = [r for r in Dump.open(a).op_records if r["phase"] == "forward"]
    rb = [r for r in Dump.open(b).op_records if r["phase"] == "forward"]
    assert [r["op"] for r in align(ra, rb).unmatched_a] == ["aten::addmm"]  # different ops by default
    mapping = tmp_path / "map.json"
    mapping.write_text(json.dumps({"equivalent": [["aten::mm", "aten::addmm"]]}))
    assert not align(ra, rb, Equivalences.load(str(mapping))).unmatched_a
    assert main(["compare", a, b, "--map", str(mapping), "--json"]) == 0  # backward differs: judged as a module
    d = json.loads(capsys.readouterr().out)
    paired = [r for r in d["ops"] if r["op"] == "aten::addmm"]
    assert paired and paired[0]["status"] == "pass"
    for bad in ('{"equivalent": [["mm"]]}', '[1]', 'nope'):
        mapping.write_text(bad)
        assert main(["compare", a, b, "--map", str(mapping)]) == 2
        assert "map.json" in capsys.readouterr().err
