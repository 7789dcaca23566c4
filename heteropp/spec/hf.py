"""HuggingFace `config.json` of the LLaMA family (LLaMA, Mistral, Qwen2) as a ModelSpec.

One reader for the trainer and the planner. What the engine computes is LLaMA's decoder as `transformers`
defines it: RMSNorm, rotary embeddings with one base (`rope_theta`), grouped-query attention, SwiGLU with
SiLU, optional q/k/v biases (Qwen2), optionally tied embeddings, Llama 3's rope scaling. Anything else in a
config that would change the computation (another activation, another rope scaling, a sliding window shorter
than the sequence, MoE, biases elsewhere) is refused naming the field, never silently ignored.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from .errors import SpecError
from .io import Fields
from .limits import MAX_LAYERS, MAX_SEQ, MAX_VOCAB, MAX_WIDTH


class _Model(Protocol):  # ModelSpec's fields this module reads (spec/model.py builds on this module)
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    seq_len: int
    rope_theta: float
    rope_scaling: tuple[float, float, float, int] | None
    norm_eps: float
    tie_embeddings: bool
    qkv_bias: bool

    @property
    def head_dim(self) -> int: ...

# model_type -> the architecture class transformers builds for causal LM training
SUPPORTED = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}


def is_hf_config(data: dict[str, Any]) -> bool:
    return "model_type" in data or "architectures" in data


def hf_config_path(directory: Path) -> Path:
    p = directory / "config.json"
    if not p.is_file():
        raise SpecError(str(directory), "<model>", "a directory without config.json",
                        "a HuggingFace model directory (config.json, optionally safetensors weights)")
    return p


# Llama 3's rope scaling (rope_type "llama3"): its fields, in ModelSpec.rope_scaling's order
LLAMA3_ROPE = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def llama3_rope(f: Fields, key: str, spec: dict[str, Any]) -> tuple[float, float, float, int]:
    """Llama 3's rope scaling from its mapping (`key` of `f`'s source): LLAMA3_ROPE's fields, checked."""
    g = Fields(spec, f.source, f"{key}.")
    factor, low, high = (g.float(k, lo=0.0, hi=1e6) for k in LLAMA3_ROPE[:3])
    old = g.int("original_max_position_embeddings", max=MAX_SEQ)
    if not (factor >= 1.0 and 0 < low < high):
        raise f.err(key, f"factor {factor}, low_freq_factor {low}, high_freq_factor {high}",
                    "factor >= 1 and 0 < low_freq_factor < high_freq_factor")
    return factor, low, high, old


def _rope(f: Fields, data: dict[str, Any]) -> tuple[float, tuple[float, float, float, int] | None]:
    """(`rope_theta`, Llama 3's rope scaling or None) from `rope_theta` and `rope_scaling` (transformers 4.x)
    or `rope_parameters` (5.x): the default rotary embedding and Llama 3.1's scaled one run; other scalings
    (linear, dynamic, yarn, longrope) are refused. A config that gives both forms, or `rope_theta` in both
    places, must give the same values: transformers takes one of each silently, and a model trained with
    the other frequencies would still run."""
    params = data.get("rope_parameters")
    scalings: dict[str, tuple[float, float, float, int] | None] = {}
    for key, spec in (("rope_scaling", data.get("rope_scaling")), ("rope_parameters", params)):
        if spec is None:
            continue
        if not isinstance(spec, dict):
            raise f.err(key, f"got {spec!r}", "a mapping or null")
        kind = spec.get("rope_type", spec.get("type", "default"))
        if kind == "llama3":
            scalings[key] = llama3_rope(f, key, spec)
        elif kind != "default":
            raise f.err(key, f"rope type {kind!r} is not implemented",
                        "no rope scaling (rope_type 'default') or Llama 3's (rope_type 'llama3')")
        else:
            scalings[key] = None
    if len(set(scalings.values())) > 1:
        raise f.err("rope_parameters", f"{_describe(scalings['rope_parameters'])}, but rope_scaling gives "
                    f"{_describe(scalings['rope_scaling'])}", "one rope scaling: the same in both, or only one")
    scaling = next(iter(scalings.values()), None)
    theta = f.float("rope_theta", 10000.0, hi=1e12)
    if isinstance(params, dict) and "rope_theta" in params:
        inner = Fields(params, f.source, "rope_parameters.").float("rope_theta", hi=1e12)
        if "rope_theta" in data and inner != theta:
            raise f.err("rope_parameters.rope_theta", f"{inner}, but rope_theta gives {theta}",
                        "one rope_theta: the same in both, or only one")
        theta = inner
    return theta, scaling


def _describe(scaling: tuple[float, float, float, int] | None) -> str:
    return "no scaling" if scaling is None else "llama3 " + ", ".join(
        f"{k} {v}" for k, v in zip(LLAMA3_ROPE, scaling))


def hf_fields(data: dict[str, Any], source: str, seq_len: int | None = None) -> dict[str, Any]:
    """ModelSpec's fields from a config.json's; `seq_len`: the training sequence length (default
    `max_position_embeddings`)."""
    f = Fields(data, source)
    kind = f.str("model_type", required=False, default="")
    archs = data.get("architectures") or []
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise f.err("architectures", f"got {archs!r}", "a list of class names")
    if kind not in SUPPORTED:
        raise f.err("model_type", f"{kind or 'missing'!r} is not a LLaMA-family model this trainer runs",
                    "one of " + ", ".join(SUPPORTED))
    if archs and archs != [SUPPORTED[kind]]:
        raise f.err("architectures", f"got {archs}", f"[{SUPPORTED[kind]!r}] for model_type {kind!r}")
    if (act := data.get("hidden_act", "silu")) != "silu":
        raise f.err("hidden_act", f"got {act!r}", "'silu' (SwiGLU)")
    for moe in ("num_local_experts", "num_experts", "num_experts_per_tok", "moe_intermediate_size"):
        if data.get(moe):
            raise f.err(moe, "mixture-of-experts models are not supported", "a dense model")
    for key in ("attention_bias", "mlp_bias"):  # LLaMA's: biases on o_proj / the MLP as well
        if data.get(key):
            raise f.err(key, "got true: biases beyond Qwen2's q/k/v are not implemented", "false")
    if (tp := data.get("pretraining_tp", 1)) not in (1, None):
        raise f.err("pretraining_tp", f"got {tp!r}: transformers then splits the projections' sums", "1")
    if data.get("attention_dropout"):
        raise f.err("attention_dropout", f"got {data['attention_dropout']!r}", "0 (no dropout)")
    layers = f.int("num_hidden_layers", max=MAX_LAYERS)
    heads = f.int("num_attention_heads", max=MAX_WIDTH)
    positions = f.int("max_position_embeddings", max=MAX_SEQ)
    length = positions if seq_len is None else Fields({"seq_len": seq_len}, "--seq-len").int("seq_len", max=MAX_SEQ)
    if length > positions:
        raise SpecError("--seq-len", "seq_len", f"{length} exceeds the model's max_position_embeddings={positions}",
                        f"at most {positions}")
    kinds = data.get("layer_types") or []
    if not isinstance(kinds, list) or any(k != "full_attention" for k in kinds):
        raise f.err("layer_types", f"got {sorted(set(map(str, kinds))) if isinstance(kinds, list) else kinds!r}",
                    "only 'full_attention' layers (sliding-window attention is not implemented)")
    window = data.get("sliding_window")
    uses_window = data.get("use_sliding_window", kind == "mistral")  # Qwen2 configs carry a window but switch it off
    if uses_window and window is not None:
        w = f.int("sliding_window", max=1 << 40)
        if w < length:
            raise f.err("sliding_window", f"{w} tokens is shorter than the sequence length {length}: sliding-window "
                        "attention is not implemented", f"null, or at least {length}")
    theta, rope_scaling = _rope(f, data)
    return dict(
        name=f.str("name_or_path", required=False, default="") or Path(source).parent.name or kind,
        layers=layers, hidden=f.int("hidden_size", max=MAX_WIDTH), heads=heads,
        kv_heads=f.int("num_key_value_heads", heads, max=MAX_WIDTH), ffn=f.int("intermediate_size", max=MAX_WIDTH),
        vocab=f.int("vocab_size", max=MAX_VOCAB), seq_len=length, rope_theta=theta, rope_scaling=rope_scaling,
        norm_eps=f.float("rms_norm_eps", 1e-6, hi=1.0), tie_embeddings=f.bool("tie_word_embeddings", False),
        qkv_bias=kind == "qwen2", explicit_head_dim=f.int("head_dim", max=MAX_WIDTH) if data.get("head_dim") else None)


# Our parameter names (StageModel's, global layer index i) <-> HuggingFace's
_LAYER = {"attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
          "attn.wq.weight": "self_attn.q_proj.weight", "attn.wk.weight": "self_attn.k_proj.weight",
          "attn.wv.weight": "self_attn.v_proj.weight", "attn.wo.weight": "self_attn.o_proj.weight",
          "attn.wq.bias": "self_attn.q_proj.bias", "attn.wk.bias": "self_attn.k_proj.bias",
          "attn.wv.bias": "self_attn.v_proj.bias",
          "ffn.gate.weight": "mlp.gate_proj.weight", "ffn.up.weight": "mlp.up_proj.weight",
          "ffn.down.weight": "mlp.down_proj.weight"}
_TOP = {"embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
        "head.weight": "lm_head.weight"}
_LAYER_BACK = {v: k for k, v in _LAYER.items()}
_TOP_BACK = {v: k for k, v in _TOP.items()}


def hf_name(name: str, m: _Model) -> str:
    """HuggingFace's name of one of our parameters; a tied head is the embedding."""
    if name in _TOP:
        return _TOP["embed.weight"] if name == "head.weight" and m.tie_embeddings else _TOP[name]
    _, layer, rest = name.split(".", 2)  # layers.<i>.<rest>
    return f"model.layers.{layer}.{_LAYER[rest]}"


def our_name(hf: str) -> str:
    if hf in _TOP_BACK:
        return _TOP_BACK[hf]
    if hf.startswith("model.layers."):
        layer, rest = hf[len("model.layers."):].split(".", 1)
        if rest in _LAYER_BACK and layer.isdigit():
            return f"layers.{layer}.{_LAYER_BACK[rest]}"
    raise KeyError(hf)


def hf_config(m: _Model, dtype: str = "float32") -> dict[str, Any]:
    """The config.json `transformers` builds this model from (export)."""
    kind = "qwen2" if m.qkv_bias else "llama"
    cfg: dict[str, Any] = {
        "architectures": [SUPPORTED[kind]], "model_type": kind, "hidden_act": "silu", "hidden_size": m.hidden,
        "intermediate_size": m.ffn, "num_hidden_layers": m.layers, "num_attention_heads": m.heads,
        "num_key_value_heads": m.kv_heads, "head_dim": m.head_dim, "vocab_size": m.vocab,
        "max_position_embeddings": m.seq_len, "rms_norm_eps": m.norm_eps, "rope_theta": m.rope_theta,
        "tie_word_embeddings": m.tie_embeddings, "torch_dtype": dtype, "initializer_range": 0.02,
        "attention_dropout": 0.0, "use_cache": True,
    }
    if m.rope_scaling is not None:
        cfg["rope_scaling"] = {"rope_type": "llama3", **dict(zip(LLAMA3_ROPE, m.rope_scaling))}
    if kind == "llama":
        cfg.update(attention_bias=False, mlp_bias=False, pretraining_tp=1)
    else:
        cfg.update(use_sliding_window=False, sliding_window=None)
    return cfg

