"""A small HuggingFace ``LlamaForCausalLM`` with random weights (nothing is downloaded) and its AdamW
training loop: the third-party model the tests and the overhead benchmark run the tools on.
Needs ``transformers`` (the ``test`` extra)."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class HFLlamaSize:
    vocab: int = 64
    hidden: int = 32
    intermediate: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    seq: int = 8
    batch: int = 2


def make_hf_llama(size: HFLlamaSize = HFLlamaSize(), attn: str = "eager", seed: int = 0):
    """A ``LlamaForCausalLM`` built from ``size`` with seeded random weights; ``attn`` is the
    attention implementation ("eager": plain matmul/softmax, "sdpa": torch's fused kernel)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=size.vocab, hidden_size=size.hidden, intermediate_size=size.intermediate,
                      num_hidden_layers=size.layers, num_attention_heads=size.heads,
                      num_key_value_heads=size.kv_heads, max_position_embeddings=max(64, size.seq),
                      attn_implementation=attn)
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg)


def hf_batches(size: HFLlamaSize, steps: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, size.vocab, (size.batch, size.seq), generator=g) for _ in range(steps)]


def hf_train_step(model, opt: torch.optim.Optimizer, ids: torch.Tensor) -> torch.Tensor:
    """One optimizer step of causal-LM loss (labels = inputs); returns the loss, not synchronised."""
    opt.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    return loss


def hf_train(model, batches: list[torch.Tensor], lr: float = 1e-3) -> list[float]:
    """AdamW steps of causal-LM loss (labels = inputs); returns the losses."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    return [hf_train_step(model, opt, ids).item() for ids in batches]


def train_hf_llama(steps: int = 1, size: HFLlamaSize = HFLlamaSize(), attn: str = "eager", seed: int = 0,
                   lr: float = 1e-3) -> list[float]:
    """A fresh model (same weights for the same seed) trained ``steps`` AdamW steps."""
    return hf_train(make_hf_llama(size, attn, seed), hf_batches(size, steps, seed), lr)
