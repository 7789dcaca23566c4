"""Model spec: LLaMA-style hyper-parameters, presets, and the per-layer parameter and activation counts."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .errors import SpecError
from .io import Fields, load_mapping


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

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def layer_params(self) -> int:
        """Weights of one decoder layer: q, k, v, o projections, SwiGLU (gate, up, down), two RMSNorms."""
        h, kv = self.hidden, self.kv_heads * self.head_dim
        return 2 * h * h + 2 * h * kv + 3 * h * self.ffn + 2 * h

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
        return self.layers * self.layer_params + self.embed_params + self.head_params

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

_KEYS = {"name", "layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq_len", "preset"}


def model_from_dict(data: dict[str, Any], source: str = "<model>") -> ModelSpec:
    f = Fields(data, source)
    f.unknown(_KEYS)
    base: dict[str, Any] = {}
    if "preset" in data:
        p = f.str("preset", choices=tuple(PRESETS))
        base = asdict(PRESETS[p])
    merged = {**base, **{k: v for k, v in data.items() if k != "preset"}}
    g = Fields(merged, source)
    m = ModelSpec(name=g.str("name", Path(source).stem), layers=g.int("layers"), hidden=g.int("hidden"),
                  heads=g.int("heads"), kv_heads=g.int("kv_heads"), ffn=g.int("ffn"), vocab=g.int("vocab"),
                  seq_len=g.int("seq_len"))
    if m.hidden % m.heads:
        raise SpecError(source, "hidden", f"{m.hidden} not divisible by heads={m.heads}", "hidden % heads == 0")
    if m.heads % m.kv_heads:
        raise SpecError(
            source, "kv_heads", f"heads={m.heads} not divisible by kv_heads={m.kv_heads}", "heads % kv_heads == 0"
        )
    return m


def load_model(name_or_path: str | Path) -> ModelSpec:
    """A preset name (`tiny`, `h2-100b`) or a YAML/JSON file."""
    if str(name_or_path) in PRESETS:
        return PRESETS[str(name_or_path)]
    p = Path(name_or_path)
    if not p.exists():
        raise SpecError(
            str(name_or_path), "<model>", "neither a preset nor a file", "one of " + ", ".join(PRESETS) + " or a path"
        )
    return model_from_dict(load_mapping(p), str(p))
