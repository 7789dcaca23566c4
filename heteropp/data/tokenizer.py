"""`heteropp data train-tokenizer`: a byte-level BPE tokenizer trained locally on the same inputs `prepare`
reads (nothing is downloaded), saved as a HuggingFace tokenizer.json whose end-of-document token is
`<|endoftext|>`."""
from __future__ import annotations

import os
from pathlib import Path

from ..spec import SpecError
from .prepare import check_inputs, iter_documents

EOS_TOKEN = "<|endoftext|>"
# Byte-level BPE starts from the 256 byte symbols and the special token; merges come on top of them.
MIN_VOCAB = 257


def train_tokenizer(inputs: list[str], out: str | os.PathLike[str], vocab_size: int, *,
                    jsonl_field: str = "text") -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    paths = check_inputs(inputs)
    if vocab_size < MIN_VOCAB:
        raise SpecError("--vocab-size", "--vocab-size", f"{vocab_size} is too small for byte-level BPE",
                        f"at least {MIN_VOCAB}")
    out_p = Path(out)
    if not out_p.parent.is_dir():
        raise SpecError(str(out_p), "--out", "its directory does not exist", "a path in an existing directory")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS_TOKEN], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(iter_documents(paths, jsonl_field), trainer=trainer)
    try:
        tok.save(str(out_p))
    except Exception as e:  # tokenizers raises a bare Exception when the file cannot be written
        raise SpecError(str(out_p), "--out", f"cannot be written ({e})", "a writable path") from None
    return out_p
