"""The token file: one memory-mapped array of token ids with its document boundaries (format in
docs/heteropp-data.md). `TokenWriter` appends documents while streaming; `TokenData` maps a finished file
read-only (several processes may map it at once) and hands out the rows of a step's batch."""
from __future__ import annotations

import os
import struct
import tempfile
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

import numpy as np

from ..spec import SpecError
from .sampler import sample_windows, windows

if TYPE_CHECKING:
    import torch

MAGIC = b"HPPTOKEN"
VERSION = 1
HEADER = struct.Struct("<8sIIQqQQQQ")  # magic, version, itemsize, vocab, eos, tokens, docs, docs_offset, reserved
HEADER_SIZE = 64
assert HEADER.size == HEADER_SIZE
# uint16 holds ids 0..65535, so a vocabulary of up to 65,536 ids; larger ones need uint32.
UINT16_MAX_VOCAB = 1 << 16
_DOC_FLUSH = 1 << 16  # document starts buffered before they go to the side file


def dtype_for_vocab(vocab: int) -> np.dtype:
    """The narrowest unsigned integer type that holds every id below `vocab`."""
    if not 1 <= vocab <= 1 << 32:
        raise ValueError(f"vocabulary size {vocab} is not in 1..2**32")
    return np.dtype("<u2") if vocab <= UINT16_MAX_VOCAB else np.dtype("<u4")


def _docs_offset(tokens: int, itemsize: int) -> int:
    """The document index starts on an 8-byte boundary after the tokens."""
    end = HEADER_SIZE + tokens * itemsize
    return (end + 7) // 8 * 8


class TokenWriter:
    """Writes a token file under a temporary name in the output's directory and renames it into place on
    `close()`: a reader never sees a half-written file, and an error leaves no file behind."""

    def __init__(self, path: str | os.PathLike[str], vocab: int, eos: int = -1) -> None:
        self.path = Path(path)
        self.vocab, self.eos = vocab, eos
        self.dtype = dtype_for_vocab(vocab)
        if eos >= vocab:
            raise ValueError(f"eos id {eos} is outside the vocabulary of {vocab}")
        self.num_tokens = self.num_docs = 0
        directory = self.path.parent
        self._f = tempfile.NamedTemporaryFile(dir=directory, prefix=f".{self.path.name}.", suffix=".tmp",
                                              delete=False)
        # Document starts go to a side file: the index of a corpus of many documents need not fit in memory.
        self._docs = tempfile.TemporaryFile(dir=directory)
        self._starts: list[int] = []
        self._f.write(b"\0" * HEADER_SIZE)
        self._closed = False

    def add_document(self, ids: np.ndarray | list[int]) -> None:
        """Append one document's ids, then the EOS id when the file has one."""
        a = np.asarray(ids, dtype=np.int64)
        if a.size and (a.min() < 0 or a.max() >= self.vocab):
            bad = int(a[(a < 0) | (a >= self.vocab)][0])
            raise ValueError(f"token id {bad} is outside the vocabulary of {self.vocab}")
        if self.eos >= 0:
            a = np.append(a, self.eos)
        self._starts.append(self.num_tokens)
        if len(self._starts) >= _DOC_FLUSH:
            self._flush_starts()
        self._f.write(a.astype(self.dtype).tobytes())
        self.num_tokens += int(a.size)
        self.num_docs += 1

    def _flush_starts(self) -> None:
        self._docs.write(np.asarray(self._starts, dtype="<u8").tobytes())
        self._starts.clear()

    def close(self) -> Path:
        """Finish the file (document index, header), sync it and rename it to its final name."""
        self._starts.append(self.num_tokens)  # the index ends with the token count: doc i is [s[i], s[i+1])
        self._flush_starts()
        itemsize = self.dtype.itemsize
        docs_offset = _docs_offset(self.num_tokens, itemsize)
        self._f.write(b"\0" * (docs_offset - HEADER_SIZE - self.num_tokens * itemsize))
        self._docs.seek(0)
        while chunk := self._docs.read(1 << 20):
            self._f.write(chunk)
        self._docs.close()
        self._f.seek(0)
        self._f.write(HEADER.pack(MAGIC, VERSION, itemsize, self.vocab, self.eos, self.num_tokens, self.num_docs,
                                  docs_offset, 0))
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()
        os.replace(self._f.name, self.path)
        self._closed = True
        return self.path

    def abort(self) -> None:
        if not self._closed:
            self._closed = True
            self._docs.close()
            self._f.close()
            Path(self._f.name).unlink(missing_ok=True)

    def __enter__(self) -> TokenWriter:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if kind is None:
            self.close()
        else:
            self.abort()


class TokenData:
    """A finished token file, mapped read-only. Opening reads the header and the file's size only; `rows`
    reads the tokens of the windows it returns and nothing else."""

    def __init__(self, path: Path, vocab: int, eos: int, num_tokens: int, num_docs: int, dtype: np.dtype,
                 docs_offset: int, seq_len: int | None) -> None:
        self.path, self.vocab, self.eos = path, vocab, eos
        self.num_tokens, self.num_docs, self.dtype = num_tokens, num_docs, dtype
        self.seq_len = seq_len
        self._docs_offset = docs_offset
        # numpy refuses to map zero bytes; an empty file has no windows anyway.
        self.tokens: np.ndarray = (np.memmap(path, dtype=dtype, mode="r", offset=HEADER_SIZE, shape=(num_tokens,))
                                   if num_tokens else np.zeros(0, dtype=dtype))

    @classmethod
    def open(cls, path: str | os.PathLike[str], vocab: int, seq_len: int | None = None) -> TokenData:
        """Map `path` for a model of `vocab` ids. The file's own vocabulary (recorded at prepare time) must not
        be larger. `seq_len`, when given, fixes what `num_sequences` counts and is checked to fit the file."""
        p = Path(path)
        src = str(p)
        try:
            size = p.stat().st_size
            with open(p, "rb") as f:
                head = f.read(HEADER_SIZE)
        except OSError as e:
            raise SpecError(src, "token file", f"cannot be read ({e.strerror or e})",
                            "a file written by `heteropp data prepare`") from None
        if len(head) < HEADER_SIZE:
            raise SpecError(src, "header", f"file is {size} bytes, shorter than the {HEADER_SIZE}-byte header",
                            "a file written by `heteropp data prepare`")
        magic, version, itemsize, fvocab, eos, tokens, docs, docs_offset, _ = HEADER.unpack(head)
        if magic != MAGIC:
            raise SpecError(src, "magic", f"starts with {magic!r}, not a heteropp token file", f"{MAGIC!r}")
        if version != VERSION:
            raise SpecError(src, "version", f"format version {version} is not supported", f"{VERSION}")
        if itemsize not in (2, 4) or fvocab < 1 or fvocab > 1 << 32 or dtype_for_vocab(fvocab).itemsize != itemsize:
            raise SpecError(src, "itemsize", f"{itemsize}-byte tokens for a vocabulary of {fvocab}",
                            f"{dtype_for_vocab(fvocab).itemsize if 1 <= fvocab <= 1 << 32 else '2 or 4'}")
        if fvocab > vocab:
            raise SpecError(src, "vocab", f"the file was tokenized with a vocabulary of {fvocab} ids, "
                            f"the model has {vocab}", f"a token file prepared with a vocabulary of <= {vocab}")
        want = _docs_offset(tokens, itemsize) + (docs + 1) * 8
        if docs_offset != _docs_offset(tokens, itemsize) or size != want:
            raise SpecError(src, "size", f"file is {size} bytes but its header describes {tokens} tokens and "
                            f"{docs} documents ({want} bytes): truncated or not fully written", f"{want} bytes")
        if not -1 <= eos < fvocab:
            raise SpecError(src, "eos", f"eos id {eos} is outside the vocabulary of {fvocab}", f"-1..{fvocab - 1}")
        data = cls(p, fvocab, eos, tokens, docs, np.dtype("<u2" if itemsize == 2 else "<u4"), docs_offset, seq_len)
        if seq_len is not None:
            data._windows(seq_len)
        return data

    def _windows(self, seq_len: int) -> int:
        if seq_len < 1:
            raise ValueError(f"seq_len must be >= 1, got {seq_len}")
        n = windows(self.num_tokens, seq_len)
        if n < 1:
            raise SpecError(str(self.path), "tokens", f"{self.num_tokens} tokens hold no sequence of "
                            f"seq_len + 1 = {seq_len + 1} tokens", f"at least {seq_len + 1} tokens")
        return n

    @property
    def num_sequences(self) -> int:
        """Windows of seq_len + 1 tokens per epoch, for the seq_len given to `open`."""
        if self.seq_len is None:
            raise ValueError("num_sequences needs the sequence length: TokenData.open(path, vocab, seq_len=...)")
        return self._windows(self.seq_len)

    def epoch(self, step: int, sequences: int, seq_len: int) -> int:
        """The epoch step `step`'s first row is drawn from (0-based)."""
        return (step - 1) * sequences // self._windows(seq_len)

    def documents(self) -> np.ndarray:
        """The document index: num_docs + 1 token offsets; document i is tokens [d[i], d[i+1]). Read on demand
        only (training never needs it)."""
        return np.fromfile(self.path, dtype="<u8", count=self.num_docs + 1, offset=self._docs_offset)

    def rows(self, seed: int, step: int, sequences: int, seq_len: int, lo: int, hi: int) -> torch.Tensor:
        """Rows [lo, hi) of step `step`'s batch of `sequences` windows of seq_len + 1 tokens, as int64
        [hi - lo, seq_len + 1]. Row r of step s is global sample (s - 1) * sequences + r (see sampler.py)."""
        n = self._windows(seq_len)
        starts = sample_windows(seed, step, sequences, lo, hi, n) * seq_len
        out = np.empty((hi - lo, seq_len + 1), dtype=self.dtype)
        for i, s in enumerate(starts.tolist()):
            out[i] = self.tokens[s:s + seq_len + 1]
        if out.size and int(out.max()) >= self.vocab:
            i, j = (int(v[0]) for v in np.nonzero(out >= self.vocab))
            at = int(starts[i]) + j
            raise SpecError(str(self.path), f"tokens[{at}]",
                            f"token id {int(out[i, j])} at byte offset {HEADER_SIZE + at * self.dtype.itemsize} "
                            f"is outside the file's vocabulary of {self.vocab}", f"ids < {self.vocab}")
        import torch  # here, not at the top: `heteropp data prepare` does not need it
        return torch.from_numpy(out.astype(np.int64))
