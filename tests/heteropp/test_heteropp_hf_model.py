"""A user's HuggingFace LLaMA-family model directory (config.json + safetensors, written by `transformers`)
as the model of the reference and of a plan: its logits equal transformers' own on the same weights and
batch (fp32 CPU), and configs the engine cannot compute are refused naming the field."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from heteropp.model import StageModel, TPGroup
from heteropp.model.hf_weights import load_hf_weights
from heteropp.spec import SpecError, load_model

from .hf_models import write_hf_model

transformers = pytest.importorskip("transformers")


def _ours(directory, seq_len: int | None = None) -> tuple[StageModel, object]:
    m = load_model(directory, seq_len)
    model = StageModel(m, range(m.layers), TPGroup(), seed=123, first=True, last=True)
    load_hf_weights([model], m, directory, 0, 1)
    return model, m


@pytest.mark.parametrize("kind,sharded", [("llama", False), ("qwen2", True), ("mistral", False)])
def test_logits_equal_transformers_on_the_same_weights(tmp_path, kind: str, sharded: bool) -> None:
    d = write_hf_model(tmp_path / kind, kind, sharded=sharded)
    if sharded:
        assert (d / "model.safetensors.index.json").is_file()
    hf = transformers.AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager").eval()
    model, m = _ours(d)
    assert (m.rope_theta, m.tie_embeddings, m.qkv_bias) == (
        hf.config.rope_parameters["rope_theta"] if hasattr(hf.config, "rope_parameters") else hf.config.rope_theta,
        hf.config.tie_word_embeddings, kind == "qwen2")
    ids = torch.randint(0, m.vocab, (3, m.seq_len), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = hf(ids).logits
        got = model(ids)
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)


# Llama 3.1's rope scaling (its config.json's rope_scaling) with an original context of 8 positions, so that at
# this head size the low, smoothed and high frequency bands each hold some of the frequencies
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8}


def test_llama_3_rope_scaling_gives_transformers_logits(tmp_path) -> None:
    """Llama 3.1 and 3.2 configs scale the rotary frequencies (rope_type "llama3"); they were refused."""
    d = write_hf_model(tmp_path / "llama3", "llama", rope_scaling=dict(LLAMA3_ROPE), rope_theta=10000.0)
    hf = transformers.AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager").eval()
    model, m = _ours(d)
    assert m.rope_scaling is not None
    ids = torch.randint(0, m.vocab, (3, m.seq_len), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want, got = hf(ids).logits, model(ids)
        # not trivially equal: without the scaling the logits differ
        plain = transformers.AutoModelForCausalLM.from_pretrained(
            d, attn_implementation="eager", rope_parameters={"rope_type": "default", "rope_theta": 10000.0}
        ).eval()(ids).logits
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)
    assert not torch.allclose(plain, want, rtol=1e-3, atol=1e-3)


def test_a_model_spec_file_holds_the_rope_scaling_of_a_hf_config(tmp_path) -> None:
    """A spec file written from a run's model fields (the elastic and torchrun configs write one) reads back the
    same model, Llama 3's rope scaling included, as its four values or as the HF config's mapping."""
    d = write_hf_model(tmp_path / "llama3", "llama", rope_scaling=dict(LLAMA3_ROPE), rope_theta=10000.0)
    m = load_model(d)
    fields = {k: v for k, v in dataclasses.asdict(m).items() if k != "explicit_head_dim"}
    fields["head_dim"] = m.head_dim  # the spec file's name of it
    for i, scaling in enumerate((fields["rope_scaling"], LLAMA3_ROPE)):
        (tmp_path / f"m{i}.json").write_text(json.dumps({**fields, "rope_scaling": scaling}))
        assert load_model(tmp_path / f"m{i}.json") == m
    (tmp_path / "bad.json").write_text(json.dumps({**fields, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}))
    with pytest.raises(SpecError) as e:
        load_model(tmp_path / "bad.json")
    assert e.value.field == "rope_scaling"


def _config(tmp_path, **fields) -> str:
    base = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 96,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128,
            "max_position_embeddings": 16, "hidden_act": "silu"}
    p = tmp_path / "config.json"
    p.write_text(json.dumps({**base, **fields}))
    return str(p)


@pytest.mark.parametrize("fields,named", [
    ({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}, "model_type"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "rope_scaling.low_freq_factor"),  # fields missing
    ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "rope_scaling"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}}, "rope_parameters"),
    ({"rope_scaling": dict(LLAMA3_ROPE), "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}},
     "rope_parameters"),  # both forms, disagreeing (transformers takes rope_scaling silently)
    ({"rope_theta": 5e5, "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}},
     "rope_parameters.rope_theta"),
    ({"model_type": "mistral", "architectures": ["MistralForCausalLM"], "sliding_window": 8}, "sliding_window"),
    ({"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"],
      "layer_types": ["full_attention", "sliding_attention"]}, "layer_types"),
    ({"num_local_experts": 8}, "num_local_experts"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"attention_bias": True}, "attention_bias"),
    ({"num_key_value_heads": 3}, "num_key_value_heads"),  # the config's own key, not the spec file's
    ({"num_attention_heads": 6}, "hidden_size"),
    ({"num_hidden_layers": 10 ** 9}, "num_hidden_layers"),
])
def test_a_config_the_engine_cannot_run_is_refused_naming_the_field(tmp_path, fields, named) -> None:
    with pytest.raises(SpecError) as e:
        load_model(_config(tmp_path, **fields))
    assert e.value.field == named


def test_rope_given_in_both_forms_alike_is_read_once(tmp_path) -> None:
    both = load_model(_config(tmp_path, rope_theta=1e4, rope_scaling=dict(LLAMA3_ROPE),
                              rope_parameters={**LLAMA3_ROPE, "rope_theta": 1e4}))
    assert (both.rope_theta, both.rope_scaling) == (1e4, (8.0, 1.0, 4.0, 8))


def test_a_weight_whose_shape_disagrees_with_the_config_is_refused_naming_it(tmp_path) -> None:
    d = write_hf_model(tmp_path / "m", "llama")
    cfg = json.loads((d / "config.json").read_text())
    cfg["intermediate_size"] = 128
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(SpecError, match=r"mlp\.gate_proj\.weight.*shape \[96, 64\].*expected \[128, 64\]"):
        _ours(d)


def test_a_truncated_safetensors_file_is_refused(tmp_path) -> None:
    d = write_hf_model(tmp_path / "m", "llama")
    f = d / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    with pytest.raises(SpecError, match="model.safetensors.*not a readable safetensors file"):
        _ours(d)


@pytest.mark.slow
def test_heteroauto_plans_simulates_and_profiles_a_hf_model_that_heteropp_then_trains(tmp_path) -> None:
    """One reader for planner and trainer: a HF directory (and its config.json) as heteroauto's model, the plan
    it writes run by `heteropp run` on that directory's weights."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    d = write_hf_model(tmp_path / "m", "llama", num_hidden_layers=4)
    train = tmp_path / "train.json"
    train.write_text(json.dumps({"global_batch": 4}))
    cluster = str(repo / "examples/clusters/two-cpu.yaml")

    def cli(*args: str) -> str:
        r = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        return r.stdout

    cli("-m", "heteropp.auto", "plan", "--model", str(d), "--cluster", cluster, "--train", str(train),
        "--json", str(tmp_path / "plan.json"), "--no-progress")
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert sum(s["layers"] for s in plan["stages"]) == 4
    out = cli("-m", "heteropp.auto", "simulate", "--model", str(d / "config.json"), "--cluster", cluster,
              "--train", str(train), str(tmp_path / "plan.json"))
    assert "iteration" in out
    cli("-m", "heteropp.auto", "profile", "--model", str(d), "--tp", "1", "--out", str(tmp_path / "profile.json"),
        "--repeats", "1")
    assert json.loads((tmp_path / "profile.json").read_text())
    cli("-m", "heteropp", "run", "--plan", str(tmp_path / "plan.json"), "--model", str(d), "--cluster", cluster,
        "--steps", "2", "--backend", "gloo", "--loss-log", str(tmp_path / "run.jsonl"))
    first = json.loads((tmp_path / "run.jsonl").read_text().splitlines()[0])
    # step 1 from the directory's weights: the loss transformers computes on the same batch
    from heteropp.engine.data import global_batch
    hf = transformers.AutoModelForCausalLM.from_pretrained(d).eval()
    m = load_model(d)
    batch = global_batch(m, 0, 1, 4)
    with torch.no_grad():
        logits = hf(batch[:, :-1]).logits.reshape(-1, m.vocab)
        want = torch.nn.functional.cross_entropy(logits, batch[:, 1:].reshape(-1))
    assert abs(first["loss"] - want.item()) < 1e-4 * want.item()
