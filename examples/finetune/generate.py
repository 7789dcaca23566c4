"""Load a model directory written by `heteropp export` with `transformers` and continue a prompt greedily.

    python generate.py out/hf --prompt "The pipeline" --tokens 20
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="a HuggingFace model directory holding tokenizer.json (heteropp export --tokenizer)")
    ap.add_argument("--prompt", default="The pipeline")
    ap.add_argument("--tokens", type=int, default=20, help="new tokens to generate")
    args = ap.parse_args(argv)
    if not (Path(args.model) / "config.json").is_file() or not (Path(args.model) / "tokenizer.json").is_file():
        ap.error(f"{args.model}: expected a directory with config.json and tokenizer.json (from heteropp export)")
    if args.tokens < 1:
        ap.error(f"--tokens {args.tokens}: expected at least 1")

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging

    logging.disable_progress_bar()

    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model).eval()
    ids = tok(args.prompt, return_tensors="pt").input_ids
    # Greedy: the same text on every run. The exported config names no end-of-text token, so it stops at
    # --tokens; id 0 is `heteropp data train-tokenizer`'s <|endoftext|>, given as padding to quiet generate().
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=args.tokens, do_sample=False, pad_token_id=0)
    text = tok.decode(out[0], skip_special_tokens=False)
    print(f"{out.shape[1] - ids.shape[1]} new tokens: {text!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
