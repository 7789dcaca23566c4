"""Model spec: LLaMA-style hyper-parameters, presets, and the per-layer parameter and activation counts."""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from .errors import SpecError
from .hf import LLAMA3_ROPE, hf_config_path, hf_fields, is_hf_config, llama3_rope
from .io import Fields, load_mapping
from .limits import MAX_LAYERS, MAX_SEQ, MAX_VOCAB, MAX_WIDTH


@dataclass(frozen=True)
class ModelSpec:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    seq_len: int
    # The LLaMA family's remaining knobs (HuggingFace's names in heteropp/spec/hf.py); the defaults are the
    # presets' and the original LLaMA's.
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = False  # the output head is the embedding matrix (one parameter, trained as one)
    qkv_bias: bool = False  # Qwen2: biases on the q, k and v projections
    explicit_head_dim: int | None = None  # None: hidden // heads
    # Llama 3's rope scaling (HF rope_type "llama3"): (factor, low_freq_factor, high_freq_factor,
    # original_max_position_embeddings); None: the plain rotary embedding
    rope_scaling: tuple[float, float, float, int] | None = None

    def __post_init__(self) -> None:
        if self.rope_scaling is not None:  # a JSON round trip (run configs, checkpoints) gives a list
            f, lo, hi, old = self.rope_scaling
            object.__setattr__(self, "rope_scaling", (float(f), float(lo), float(hi), int(old)))

    @property
    def head_dim(self) -> int:
        return self.explicit_head_dim or self.hidden // self.heads

    @property
    def q_dim(self) -> int:
        """Width of the query projection (and input of the output projection): heads x head_dim."""
        return self.heads * self.head_dim

    @property
    def layer_params(self) -> int:
        """Weights of one decoder layer: q, k, v, o projections (q/k/v biases), SwiGLU, two RMSNorms."""
        h, q, kv = self.hidden, self.q_dim, self.kv_heads * self.head_dim
        bias = q + 2 * kv if self.qkv_bias else 0
        return 2 * h * q + 2 * h * kv + bias + 3 * h * self.ffn + 2 * h

    def kv_replicas(self, tp: int) -> int:
        """TP ranks holding each key/value head: with more ranks than heads each is replicated (Megatron)."""
        return max(1, tp // self.kv_heads)

    def kv_copy_params(self, tp: int) -> int:
        """Key/value weights of one layer that a TP group holds beyond one copy (replicas past the first)."""
        return 2 * self.hidden * self.head_dim * self.kv_heads * (self.kv_replicas(tp) - 1)

    def layer_params_tp_group(self, tp: int) -> int:
        """One decoder layer's weights summed over the `tp` ranks of its TP group, as the engine builds
        them: projections split, replicated key/value heads counted once per rank holding them, and the
        two RMSNorm weights whole on every rank."""
        return self.layer_params + self.kv_copy_params(tp) + 2 * self.hidden * (tp - 1)

    def layer_params_per_rank(self, tp: int) -> float:
        """Weights of one decoder layer on each of `tp` ranks; with replicated key/value heads exactly what
        the engine builds (one whole key/value head per rank, whole norms)."""
        return self.layer_params_tp_group(tp) / tp

    @property
    def embed_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def head_params(self) -> int:
        """Untied output projection plus the final norm."""
        return self.vocab * self.hidden + self.hidden

    @property
    def total_params(self) -> int:
        """Distinct weights: a tied head is the embedding (the last stage still holds a copy of it)."""
        head = self.hidden if self.tie_embeddings else self.head_params
        return self.layers * self.layer_params + self.embed_params + head

    def layer_flops_fwd(self, tokens: int, tp: int = 1) -> float:
        """Forward FLOPs of one layer for `tokens` tokens of one sequence length (causal attention halves QK and
        AV), summed over a TP group of `tp` ranks: a replicated key/value head is projected on each rank."""
        mm = 2.0 * tokens * (self.layer_params - 2 * self.hidden + self.kv_copy_params(tp))
        attn = 2.0 * 2.0 * tokens * self.seq_len * self.hidden * 0.5
        return mm + attn

    def head_flops_fwd(self, tokens: int) -> float:
        return 2.0 * tokens * self.hidden * self.vocab

    def activation_bytes(self, tokens: int, tp: int, bytes_per: int = 2, sequence_parallel: bool = False) -> float:
        """Activations one layer saves for backward, per chip of a TP group (Megatron-style accounting with
        flash attention): norm inputs/outputs are replicated over TP unless sequence parallelism shards them;
        q/k/v, attention output and the three SwiGLU tensors are split by TP (with more ranks than key/value
        heads, each rank's k/v hold one whole head)."""
        h, kv = self.hidden, self.kv_heads * self.kv_replicas(tp) * self.head_dim
        replicated = 4 * h
        split = (h + 2 * kv) + h + 3 * self.ffn
        per_token = (replicated / tp if sequence_parallel else replicated) + split / tp
        return bytes_per * tokens * per_token

    def checkpoint_bytes(self, tokens: int, tp: int, bytes_per: int = 2, sequence_parallel: bool = False) -> float:
        """With full recompute a layer keeps only its input."""
        return bytes_per * tokens * self.hidden / (tp if sequence_parallel else 1)


PRESETS: dict[str, ModelSpec] = {
    # Table 4 of the H2 paper: the 100B model.
    "h2-100b": ModelSpec("h2-100b", layers=96, hidden=8192, heads=64, kv_heads=8, ffn=36864, vocab=92544, seq_len=4096),
    # Trains on one CPU in seconds; used by tests, the profiler and the demo.
    "tiny": ModelSpec("tiny", layers=8, hidden=64, heads=4, kv_heads=2, ffn=172, vocab=256, seq_len=32),
}

_KEYS = {"name", "layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq_len", "preset", "rope_theta", "norm_eps",
         "tie_embeddings", "qkv_bias", "head_dim", "rope_scaling"}


def _rope_scaling(g: Fields, value: Any) -> tuple[float, float, float, int] | None:
    """A spec's `rope_scaling`: null, Llama 3's as in a HF config (a mapping of LLAMA3_ROPE's fields, its
    rope_type llama3 if given), or those four values in that order (ModelSpec's own form)."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)) and len(value) == len(LLAMA3_ROPE):
        value = dict(zip(LLAMA3_ROPE, value))
    if not isinstance(value, dict) or value.get("rope_type", "llama3") != "llama3":
        raise g.err("rope_scaling", f"got {value!r}", "null, or Llama 3's: {rope_type: llama3, " +
                    ", ".join(f"{k}: ..." for k in LLAMA3_ROPE) + "}")
    return llama3_rope(g, "rope_scaling", value)


def model_from_dict(data: dict[str, Any], source: str = "<model>") -> ModelSpec:
    f = Fields(data, source)
    f.unknown(_KEYS)
    base: dict[str, Any] = {}
    if "preset" in data:
        p = f.str("preset", choices=tuple(PRESETS))
        base = asdict(PRESETS[p])
    merged = {**base, **{k: v for k, v in data.items() if k != "preset"}}
    g = Fields(merged, source)
    m = ModelSpec(name=g.str("name", Path(source).stem), layers=g.int("layers", max=MAX_LAYERS),
                  hidden=g.int("hidden", max=MAX_WIDTH), heads=g.int("heads", max=MAX_WIDTH),
                  kv_heads=g.int("kv_heads", max=MAX_WIDTH), ffn=g.int("ffn", max=MAX_WIDTH),
                  vocab=g.int("vocab", max=MAX_VOCAB), seq_len=g.int("seq_len", max=MAX_SEQ),
                  rope_theta=g.float("rope_theta", 10000.0, hi=1e12), norm_eps=g.float("norm_eps", 1e-5, hi=1.0),
                  tie_embeddings=g.bool("tie_embeddings", False), qkv_bias=g.bool("qkv_bias", False),
                  explicit_head_dim=g.int("head_dim", max=MAX_WIDTH) if "head_dim" in merged else None,
                  rope_scaling=_rope_scaling(g, merged.get("rope_scaling")))
    return check_shape(m, source)


# a HuggingFace config's names of the fields check_shape names
_HF_KEYS = {"hidden": "hidden_size", "heads": "num_attention_heads", "kv_heads": "num_key_value_heads"}


def check_shape(m: ModelSpec, source: str, hf: bool = False) -> ModelSpec:
    """The divisibility rules every reader (YAML/JSON specs, HF configs) applies; the fields are named as the
    file names them (ModelSpec's, or with `hf` the HuggingFace config's)."""
    def name(field: str) -> str:
        return _HF_KEYS[field] if hf else field

    if m.explicit_head_dim is None and m.hidden % m.heads:
        raise SpecError(source, name("hidden"), f"{m.hidden} not divisible by {name('heads')}={m.heads}",
                        f"{name('hidden')} % {name('heads')} == 0")
    if m.heads % m.kv_heads:
        raise SpecError(source, name("kv_heads"), f"{name('heads')}={m.heads} not divisible by "
                        f"{name('kv_heads')}={m.kv_heads}", f"{name('heads')} % {name('kv_heads')} == 0")
    return m


def load_model(name_or_path: str | Path, seq_len: int | None = None) -> ModelSpec:
    """A preset name (`tiny`, `h2-100b`), a YAML/JSON spec file, or a HuggingFace model directory or its
    `config.json` (LLaMA, Mistral, Qwen2). `seq_len` overrides the training sequence length (for a HF
    config it is otherwise `max_position_embeddings`)."""
    if str(name_or_path) in PRESETS:
        m = PRESETS[str(name_or_path)]
    else:
        p = Path(name_or_path)
        if not p.exists():
            raise SpecError(str(name_or_path), "<model>", "neither a preset nor a file or directory",
                            "one of " + ", ".join(PRESETS) + ", a spec file, or a HuggingFace model directory")
        if p.is_dir():
            p = hf_config_path(p)
        data = load_mapping(p)
        if is_hf_config(data):
            return check_shape(ModelSpec(**hf_fields(data, str(p), seq_len)), str(p), hf=True)
        m = model_from_dict(data, str(p))
    if seq_len is not None:
        m = replace(m, seq_len=Fields({"seq_len": seq_len}, "--seq-len").int("seq_len", max=MAX_SEQ))
    return m
