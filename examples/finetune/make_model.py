"""Write a small random-weight LLaMA model directory (config.json + model.safetensors) whose vocabulary is a
tokenizer's, with `transformers` itself, as a downloaded model directory would be. Small enough to train on
a laptop CPU: hidden 128, 4 decoder layers.

    python make_model.py --tokenizer out/tokenizer.json --out out/model
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer", required=True, help="tokenizer.json (from `heteropp data train-tokenizer`)")
    ap.add_argument("--out", required=True, help="model directory to write")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=128, help="max_position_embeddings")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if not Path(args.tokenizer).is_file():
        ap.error(f"--tokenizer {args.tokenizer}: not a file (expected a tokenizer.json)")

    import torch
    from tokenizers import Tokenizer
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging

    logging.disable_progress_bar()

    tok = Tokenizer.from_file(args.tokenizer)
    # One past the largest id, as `heteropp data prepare` records it: every token of the token file fits.
    vocab = tok.get_vocab_size(with_added_tokens=True)
    eos = tok.token_to_id("<|endoftext|>")
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=args.hidden, intermediate_size=args.hidden * 8 // 3 // 8 * 8,
        num_hidden_layers=args.layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=args.seq_len, rms_norm_eps=1e-5, rope_theta=10000.0,
        bos_token_id=eos, eos_token_id=eos, pad_token_id=eos, tie_word_embeddings=False,
    )
    torch.manual_seed(args.seed)
    model = LlamaForCausalLM(config)
    model.save_pretrained(args.out)
    n = sum(p.numel() for p in model.parameters())
    print(f"{args.out}: LLaMA, {args.layers} layers, hidden {args.hidden}, vocabulary {vocab}, {n:,} parameters")
    return 0


if __name__ == "__main__":
    sys.exit(main())
