"""Runs that start from different weights or buffers are a divergence of their own (model_state).

Every op of a compare is judged on each run's own inputs and regions against the drift their inputs
carry, so a difference in what no op made passed every check: a HuggingFace LLaMA built with another
``rope_theta`` (its rotary ``inv_freq`` buffer computed from it) or with one weight loaded 1e-4 off
compared "no divergence". The reference here is the models themselves: which tensor the test changed."""
import json
import subprocess
import sys

import pytest
import torch

from ditorch_precision import Capture, compare_dumps
from ditorch_precision.diff import CompareOptions
from ditorch_precision.examples.hf_llama import HFLlamaSize, hf_batches, hf_train_step

pytest.importorskip("transformers")
SIZE = HFLlamaSize()


def _llama(rope_theta: float = 10000.0):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=SIZE.vocab, hidden_size=SIZE.hidden, intermediate_size=SIZE.intermediate,
                      num_hidden_layers=SIZE.layers, num_attention_heads=SIZE.heads, num_key_value_heads=SIZE.kv_heads,
                      max_position_embeddings=64, attn_implementation="eager", rope_theta=rope_theta)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg)


def _capture(path, model, mode: str, hook: str = "auto", steps: int = 2, lr: float = 1e-3, before: int = 0,
             lr_before: float | None = None, data: list | None = None):
    opt = torch.optim.AdamW(model.parameters(), lr=lr_before or lr)
    data = data or hf_batches(SIZE, before + steps)
    for ids in data[:before]:  # trained outside the capture
        hf_train_step(model, opt, ids)
    for group in opt.param_groups:
        group["lr"] = lr
    with Capture(str(path), mode=mode, hook=hook):
        for ids in data[before:]:
            hf_train_step(model, opt, ids)


def _cli(a, b) -> tuple[int, dict]:
    p = subprocess.run([sys.executable, "-m", "ditorch_precision.cli", "compare", str(a), str(b), "--json"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode in (0, 1), p.stderr[-2000:]
    return p.returncode, json.loads(p.stdout)


def _state_rows(report: dict) -> list[dict]:
    return [r for r in report["ops"] if r["op"] == "module::state"]


@pytest.mark.parametrize("mode,hook", [("full", "auto"), ("stats", "auto"), ("full", "python")])
def test_a_buffer_computed_from_another_rope_theta_is_the_first_divergence(tmp_path, mode, hook):
    _capture(tmp_path / "ref", _llama(), mode, hook)
    _capture(tmp_path / "bad", _llama(rope_theta=10001.0), mode, hook)
    rc, d = _cli(tmp_path / "bad", tmp_path / "ref")
    assert rc == 1, d["first_divergence"]
    first = d["first_divergence"]
    assert first["op"] == "module::state" and first["rule"] == "state" and first["module"] == "LlamaForCausalLM"
    # named: the two buffers HF computes from the config value (the frequencies and their original copy), no weight
    detail = first["detail"]
    assert detail.startswith("2 of the 23 parameters and buffers") and ".weight" not in detail, detail
    assert "buffer:model.rotary_emb.inv_freq:" in detail and "buffer:model.rotary_emb.original_inv_freq:" in detail
    assert first["index"] == min(r["index"] for r in d["ops"])  # before the model's first op


def test_one_weight_off_by_1e_4_is_found_and_named(tmp_path):
    _capture(tmp_path / "ref", _llama(), "full")
    model = _llama()
    with torch.no_grad():
        model.model.layers[1].mlp.up_proj.weight.mul_(1 + 1e-4)
    _capture(tmp_path / "bad", model, "full")
    rc, d = _cli(tmp_path / "bad", tmp_path / "ref")
    first = d["first_divergence"]
    assert rc == 1 and first["op"] == "module::state", first
    assert "model.layers.1.mlp.up_proj.weight:" in first["detail"] and "max_rel 0.0001" in first["detail"], first
    # aligned by call index as well
    report = compare_dumps(str(tmp_path / "bad"), str(tmp_path / "ref"), options=CompareOptions(align="index"))
    assert not report.passed and report.first_divergence["op"] == "module::state", report.first_divergence


def test_runs_from_the_same_weights_pass_the_state_check(tmp_path):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _capture(tmp_path / "ref", _llama(), "stats")
        torch.set_num_threads(2)
        _capture(tmp_path / "other", _llama(), "stats")
    finally:
        torch.set_num_threads(threads)
    rc, d = _cli(tmp_path / "other", tmp_path / "ref")
    assert rc == 0, d["first_divergence"]
    assert [(r["status"], r["rule"]) for r in _state_rows(d)] == [("pass", "state")]


def test_weights_trained_apart_before_the_capture_are_drift_not_a_failure(tmp_path):
    # the same model trained two steps outside the capture at other learning rates: its weights
    # differ honestly when the capture starts (the optimizer holds state then)
    _capture(tmp_path / "ref", _llama(), "full", before=2)
    _capture(tmp_path / "other", _llama(), "full", before=2, lr_before=1.1e-3)
    rc, d = _cli(tmp_path / "other", tmp_path / "ref")
    rows = _state_rows(d)
    assert [(r["status"], r["rule"]) for r in rows] == [("drift", "state")], rows
    assert "trained before the capture" in rows[0]["detail"]
    assert rc == 0, d["first_divergence"]


def test_a_capture_without_the_state_record_is_compared_with_a_note(tmp_path):
    for run in ("a", "b"):
        _capture(tmp_path / run, _llama(), "stats")
    meta = tmp_path / "a" / "meta.json"
    m = json.loads(meta.read_text())
    del m["model_state"]  # as an earlier version wrote it
    meta.write_text(json.dumps(m))
    report = compare_dumps(str(tmp_path / "a"), str(tmp_path / "b"))
    assert report.passed and any("parameters and buffers" in n for n in report.notes), report.notes
    assert not [r for r in report.ops if r["op"] == "module::state"]


@pytest.mark.parametrize("mode,hook", [("full", "auto"), ("full", "python")])
def test_one_token_fed_differently_at_step_1_is_found_naming_the_inputs(tmp_path, mode, hook):
    data = hf_batches(SIZE, 3)
    _capture(tmp_path / "ref", _llama(), mode, hook, steps=3, data=data)
    other = [t.clone() for t in data]
    other[1][0, 3] = (other[1][0, 3] + 1) % SIZE.vocab  # a loader that fed one other token at step 1
    _capture(tmp_path / "bad", _llama(), mode, hook, steps=3, data=other)
    rc, d = _cli(tmp_path / "bad", tmp_path / "ref")
    first = d["first_divergence"]
    assert rc == 1 and first["op"] == "module::input" and first["rule"] == "data" and first["step"] == 1, first
    assert "input_ids: 1 of 16 elements differ" in first["detail"] and "labels: 1 of 16" in first["detail"], first
    fed = [r for r in d["ops"] if r["op"] == "module::input"]
    assert [(r["step"], r["status"]) for r in fed] == [(0, "pass"), (1, "fail"), (2, "pass")], fed


def test_a_tensor_only_the_reference_holds_is_counted_not_passed_over(tmp_path):
    _capture(tmp_path / "a", _llama(), "full")
    ref = _llama()
    ref.model.register_buffer("extra", torch.ones(3))  # one buffer the run under test does not have
    _capture(tmp_path / "b", ref, "full")
    rc, d = _cli(tmp_path / "a", tmp_path / "b")
    rows = _state_rows(d)
    assert rc == 0 and [r["status"] for r in rows] == ["pass"], rows
    assert "1 not compared (in one run only" in rows[0]["detail"], rows[0]["detail"]
