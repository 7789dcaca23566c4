"""`heteropp data prepare`: tokenize text and JSON-lines files into a token file, streaming.

Inputs are read line by line and tokenized in batches; token ids go to the output as each batch is done, so
memory holds one batch, never the corpus. A `.jsonl` file holds one JSON object per line and its document is
the object's string field (`text` unless told); every other file is UTF-8 text whose documents are its
paragraphs: runs of non-blank lines, joined with their line ends, without the last one.
"""
from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from ..spec import SpecError
from .tokenfile import TokenWriter

# EOS tokens recognised by name when neither --eos nor the model directory's tokenizer_config.json names one.
KNOWN_EOS = ("</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>", "<|im_end|>")
BATCH_DOCS = 512
BATCH_CHARS = 1 << 18  # a batch's Encodings take ~70 bytes per token: ~30 MB at this size


def is_jsonl(path: Path) -> bool:
    return path.suffix.lower() == ".jsonl"


def check_inputs(paths: list[str]) -> list[Path]:
    if not paths:
        raise SpecError("inputs", "inputs", "no input files given", "one or more text or .jsonl files")
    out = []
    for p in map(Path, paths):
        if not p.is_file():
            raise SpecError(str(p), "input", "does not exist or is not a file", "a text or .jsonl file")
        out.append(p)
    return out


def _decode(raw: bytes, path: Path, line: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SpecError(f"{path}:{line}", "text", f"not UTF-8 ({e.reason} at byte {e.start} of the line)",
                        "UTF-8 text") from None


def iter_documents(paths: list[Path], jsonl_field: str = "text",
                   on_bytes: Callable[[int], None] | None = None) -> Iterator[str]:
    """The documents of `paths` in order (empty ones skipped); `on_bytes(n)` after each n bytes read."""
    for path in paths:
        with open(path, "rb") as f:
            para: list[str] = []
            for line, raw in enumerate(f, 1):
                if on_bytes:
                    on_bytes(len(raw))
                text = _decode(raw, path, line)
                if is_jsonl(path):
                    if text.strip():
                        doc = _jsonl_document(text, jsonl_field, path, line)
                        if doc:
                            yield doc
                elif text.strip():
                    para.append(text)
                elif para:
                    yield "".join(para).rstrip("\r\n")
                    para = []
            if para:
                yield "".join(para).rstrip("\r\n")


def _jsonl_document(text: str, field: str, path: Path, line: int) -> str:
    try:
        obj: Any = json.loads(text)
    except json.JSONDecodeError as e:
        raise SpecError(f"{path}:{line}", "json", f"not a JSON object ({e.msg} at column {e.colno})",
                        "one JSON object per line") from None
    if not isinstance(obj, dict) or field not in obj:
        raise SpecError(f"{path}:{line}", field, "missing", f"an object with a string field '{field}' "
                        "(--jsonl-field names another)")
    doc = obj[field]
    if not isinstance(doc, str):
        raise SpecError(f"{path}:{line}", field, f"is {type(doc).__name__}, not a string", "a string")
    return doc


def tokenizer_file(path: str | os.PathLike[str]) -> Path:
    """`path` itself, or the tokenizer.json of a model directory."""
    p = Path(path)
    f = p / "tokenizer.json" if p.is_dir() else p
    if not f.is_file():
        raise SpecError(str(path), "--tokenizer", "no tokenizer.json there" if p.is_dir() else "does not exist",
                        "a tokenizer.json file or a model directory holding one")
    return f


def load_tokenizer(path: str | os.PathLike[str]) -> Any:
    from tokenizers import Tokenizer
    f = tokenizer_file(path)
    try:
        return Tokenizer.from_file(str(f))
    except Exception as e:  # tokenizers raises a bare Exception for a malformed file
        raise SpecError(str(f), "--tokenizer", f"not a tokenizer file ({str(e).splitlines()[0][:200]})",
                        "a HuggingFace tokenizers tokenizer.json") from None


def vocab_size(tok: Any) -> int:
    """Ids the tokenizer can produce: one past the largest id, added tokens included."""
    return int(max(tok.get_vocab(with_added_tokens=True).values())) + 1


def _configured_eos(tok_file: Path) -> str | None:
    """The eos_token of a tokenizer_config.json next to tokenizer.json (HF model directories have one)."""
    cfg = tok_file.parent / "tokenizer_config.json"
    try:
        data = json.loads(cfg.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    eos = data.get("eos_token") if isinstance(data, dict) else None
    if isinstance(eos, dict):
        eos = eos.get("content")
    return eos if isinstance(eos, str) else None


def resolve_eos(tok: Any, tok_file: Path, eos: str | None) -> int:
    """--eos as an id, a token string or `none` (-1: no separator, boundaries only in the document index);
    without it, the model directory's eos_token or a known special token."""
    vocab = vocab_size(tok)
    if eos is None:
        name = _configured_eos(tok_file)
        if name is None:
            specials = {t for t in KNOWN_EOS if tok.token_to_id(t) is not None}
            name = next((t for t in KNOWN_EOS if t in specials), None)
        if name is None:
            raise SpecError(str(tok_file), "--eos", "the tokenizer names no end-of-document token",
                            "--eos TOKEN, --eos ID or --eos none")
        eos = name
    if eos.lower() == "none":
        return -1
    if eos.isdigit():
        i = int(eos)
        if i >= vocab:
            raise SpecError("--eos", "--eos", f"id {i} is outside the tokenizer's vocabulary of {vocab}",
                            f"an id < {vocab}")
        return i
    i = tok.token_to_id(eos)
    if i is None:
        raise SpecError(str(tok_file), "--eos", f"token {eos!r} is not in the tokenizer's vocabulary",
                        "a token of the tokenizer, an id, or none")
    return int(i)


class Progress:
    """Bytes read of the total on `stream`, at most once a second, and once at the end."""

    def __init__(self, total: int, stream: TextIO | None, label: str) -> None:
        self.total, self.stream, self.label = max(total, 1), stream, label
        self.done = self.tokens = 0
        self._last = 0.0
        self._tty = bool(stream and stream.isatty())

    def add(self, n: int) -> None:
        self.done += n

    def show(self, final: bool = False) -> None:
        now = time.monotonic()
        if self.stream is None or not (final or now - self._last >= 1.0):
            return
        self._last = now
        start, end = ("\r" if self._tty else ""), ("\n" if final or not self._tty else "")
        self.stream.write(f"{start}{self.label}: {self.done / 1e6:.1f} / "
                          f"{self.total / 1e6:.1f} MB read ({100 * self.done / self.total:.0f}%), "
                          f"{self.tokens:,} tokens{end}")
        self.stream.flush()


@dataclass
class PrepareResult:
    path: Path
    num_tokens: int
    num_docs: int
    vocab: int
    eos: int
    dtype: str


def prepare(tokenizer: str | os.PathLike[str], out: str | os.PathLike[str], inputs: list[str], *,
            jsonl_field: str = "text", eos: str | None = None, progress: TextIO | None = sys.stderr,
            batch_docs: int = BATCH_DOCS, batch_chars: int = BATCH_CHARS) -> PrepareResult:
    """Tokenize `inputs` with `tokenizer` into the token file `out` (see the module's docstring)."""
    paths = check_inputs(inputs)
    tok_file = tokenizer_file(tokenizer)
    tok = load_tokenizer(tok_file)
    vocab = vocab_size(tok)
    eos_id = resolve_eos(tok, tok_file, eos)
    out_p = Path(out)
    if not out_p.parent.is_dir():
        raise SpecError(str(out_p), "--out", "its directory does not exist", "a path in an existing directory")
    meter = Progress(sum(p.stat().st_size for p in paths), progress, "heteropp data prepare")
    batch: list[str] = []
    chars = 0
    try:
        writer = TokenWriter(out_p, vocab, eos_id)
    except OSError as e:
        raise SpecError(str(out_p), "--out", f"cannot be written ({e.strerror or e})", "a writable path") from None

    def flush() -> None:
        for enc in tok.encode_batch(batch, add_special_tokens=False):
            writer.add_document(np.asarray(enc.ids, dtype=np.int64))
        meter.tokens = writer.num_tokens
        batch.clear()
        meter.show()

    try:
        with writer:
            for doc in iter_documents(paths, jsonl_field, meter.add):
                batch.append(doc)
                chars += len(doc)
                if len(batch) >= batch_docs or chars >= batch_chars:
                    flush()
                    chars = 0
            if batch:
                flush()
    except OSError as e:  # a full disk, an input that vanished: named, no traceback
        raise SpecError(str(e.filename or out_p), "io", f"{e.strerror or e}", "readable inputs and room for "
                        "the output") from None
    meter.tokens = writer.num_tokens
    meter.show(final=True)
    return PrepareResult(out_p, writer.num_tokens, writer.num_docs, vocab, eos_id, writer.dtype.name)
