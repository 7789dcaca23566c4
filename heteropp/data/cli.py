"""`heteropp data prepare | train-tokenizer | info`: the data sub-commands of the `heteropp` CLI
(`add_data_commands`), also runnable alone as `python -m heteropp.data.cli`."""
from __future__ import annotations

import argparse
import sys

from ..argtypes import at_least
from ..spec import SpecError


def cmd_prepare(a: argparse.Namespace) -> int:
    from .prepare import prepare
    r = prepare(a.tokenizer, a.out, a.inputs, jsonl_field=a.jsonl_field, eos=a.eos,
                progress=None if a.quiet else sys.stderr)
    print(f"{r.path}: {r.num_tokens} tokens in {r.num_docs} documents, {r.dtype}, vocabulary {r.vocab}, "
          f"eos {r.eos if r.eos >= 0 else 'none'}")
    return 0


def cmd_train_tokenizer(a: argparse.Namespace) -> int:
    from .tokenizer import train_tokenizer
    out = train_tokenizer(a.inputs, a.out, a.vocab_size, jsonl_field=a.jsonl_field)
    print(f"{out}: byte-level BPE tokenizer, vocabulary {a.vocab_size}")
    return 0


def cmd_info(a: argparse.Namespace) -> int:
    from .tokenfile import TokenData
    d = TokenData.open(a.file, 1 << 32)
    print(f"{d.path}: {d.num_tokens} tokens in {d.num_docs} documents, {d.dtype.name}, vocabulary {d.vocab}, "
          f"eos {d.eos if d.eos >= 0 else 'none'}")
    if a.seq_len:
        print(f"seq_len {a.seq_len}: {d._windows(a.seq_len)} sequences of {a.seq_len + 1} tokens per epoch")
    return 0


def add_data_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `data` with its sub-commands to a `heteropp` subparsers action; each sets `fn(args) -> int`."""
    p = sub.add_parser("data", help="token files for training: prepare, train-tokenizer, info",
                       description="Token files for training (format: docs/heteropp-data.md).")
    dsub = p.add_subparsers(dest="data_command", required=True, metavar="{prepare,train-tokenizer,info}")

    pp = dsub.add_parser("prepare", help="tokenize text / .jsonl files into a token file",
                         description="Tokenize text files (documents: blank-line-separated paragraphs) and .jsonl "
                                     "files (documents: a string field per line) into a memory-mapped token file.")
    pp.add_argument("inputs", nargs="+", help="text or .jsonl files, in order")
    pp.add_argument("--tokenizer", required=True, help="a tokenizer.json, or a model directory holding one")
    pp.add_argument("--out", required=True, help="the token file to write (written whole, then renamed)")
    pp.add_argument("--jsonl-field", default="text", help="the field of a .jsonl object holding its text")
    pp.add_argument("--eos", help="end-of-document token (string or id) after each document, or 'none'; "
                                  "default: the model directory's eos_token or a known special token")
    pp.add_argument("--quiet", action="store_true", help="no progress on stderr")
    pp.set_defaults(fn=cmd_prepare)

    pt = dsub.add_parser("train-tokenizer", help="train a byte-level BPE tokenizer.json on local files")
    pt.add_argument("inputs", nargs="+", help="text or .jsonl files")
    pt.add_argument("--out", required=True, help="tokenizer.json to write")
    pt.add_argument("--vocab-size", type=at_least(257), default=4096, help="vocabulary size (default 4096)")
    pt.add_argument("--jsonl-field", default="text", help="the field of a .jsonl object holding its text")
    pt.set_defaults(fn=cmd_train_tokenizer)

    pi = dsub.add_parser("info", help="print a token file's header")
    pi.add_argument("file")
    pi.add_argument("--seq-len", type=at_least(1), help="also count the sequences of this length per epoch")
    pi.set_defaults(fn=cmd_info)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="heteropp")
    add_data_commands(parser.add_subparsers(dest="command", required=True))
    a = parser.parse_args(argv)
    try:
        return int(a.fn(a))
    except SpecError as e:
        print(f"heteropp: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
