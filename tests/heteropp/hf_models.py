"""Small random-weight HuggingFace models of the LLaMA family, written to disk by `transformers` itself
(config.json + safetensors), as a user's model directory would be. Nothing is downloaded."""
from __future__ import annotations

from pathlib import Path

import torch

# Each a different corner of the family: GQA with a large rope base, Qwen2's q/k/v biases with tied
# embeddings, Mistral with an explicit head_dim wider than hidden / heads.
CONFIGS = {
    "llama": dict(model_type="llama", hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=128, max_position_embeddings=16, rope_theta=500000.0,
                  rms_norm_eps=1e-6),
    "qwen2": dict(model_type="qwen2", hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=128, max_position_embeddings=16, rope_theta=1000000.0,
                  rms_norm_eps=1e-6, tie_word_embeddings=True),
    "mistral": dict(model_type="mistral", hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=24, vocab_size=128,
                    max_position_embeddings=16, rms_norm_eps=1e-5, sliding_window=None),
}


def write_hf_model(directory: Path, kind: str, seed: int = 0, sharded: bool = False, **overrides) -> Path:
    """A random-weight model of `kind` saved by save_pretrained (sharded into several safetensors files and
    an index when `sharded`); the norms' weights are randomised too, so a swapped name cannot pass."""
    from transformers import AutoConfig, AutoModelForCausalLM

    params = {**CONFIGS[kind], **overrides}
    config = AutoConfig.for_model(**params)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").float()
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.copy_(1 + 0.1 * torch.randn_like(p))  # norms and biases: not their defaults
    model.save_pretrained(directory, max_shard_size="40KB" if sharded else "10GB")
    return directory
