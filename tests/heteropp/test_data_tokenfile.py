"""The token file (docs/heteropp-data.md): its bytes against the documented layout, the uint16 / uint32 choice,
files that `TokenData.open` refuses, an out-of-vocabulary token found by `rows`, and `rows` touching only the
pages of the windows it returns."""
from __future__ import annotations

import ctypes
import mmap
import os
import struct
from pathlib import Path

import numpy as np
import pytest

from heteropp.data import TokenData, TokenWriter
from heteropp.spec import SpecError

# The documented header, written out here rather than imported: the test reads the bytes as the page says.
DOC_HEADER = "<8sIIQqQQQQ"


def _parse(path: Path) -> dict:
    raw = path.read_bytes()
    magic, version, itemsize, vocab, eos, ntok, ndoc, docs_off, reserved = struct.unpack_from(DOC_HEADER, raw, 0)
    dt = {2: "<u2", 4: "<u4"}[itemsize]
    tokens = np.frombuffer(raw, dtype=dt, count=ntok, offset=64)
    docs = np.frombuffer(raw, dtype="<u8", count=ndoc + 1, offset=docs_off)
    return dict(magic=magic, version=version, itemsize=itemsize, vocab=vocab, eos=eos, tokens=tokens, docs=docs,
                docs_off=docs_off, reserved=reserved, size=len(raw))


def _write(path: Path, docs: list[list[int]], vocab: int, eos: int = -1) -> Path:
    with TokenWriter(path, vocab, eos) as w:
        for d in docs:
            w.add_document(d)
    return path


def test_bytes_follow_the_documented_layout(tmp_path: Path) -> None:
    docs = [[5, 6, 7], [], [8] * 5, [1, 2]]
    f = _parse(_write(tmp_path / "a.tok", docs, vocab=300, eos=9))
    assert (f["magic"], f["version"], f["itemsize"], f["vocab"], f["eos"], f["reserved"]) == \
        (b"HPPTOKEN", 1, 2, 300, 9, 0)
    want = [t for d in docs for t in [*d, 9]]
    assert f["tokens"].tolist() == want
    assert f["docs"].tolist() == [0, 4, 5, 11, 14]
    assert f["docs_off"] == (64 + 2 * len(want) + 7) // 8 * 8
    assert f["size"] == f["docs_off"] + 8 * (len(docs) + 1)
    # Without an EOS the boundaries live in the index only.
    g = _parse(_write(tmp_path / "b.tok", docs, vocab=300))
    assert g["eos"] == -1 and g["tokens"].tolist() == [t for d in docs for t in d]
    assert g["docs"].tolist() == [0, 3, 3, 8, 10]


@pytest.mark.parametrize("vocab,itemsize", [(300, 2), (65536, 2), (65537, 4), (200_000, 4)])
def test_uint16_up_to_65536_ids_else_uint32(tmp_path: Path, vocab: int, itemsize: int) -> None:
    top = vocab - 1  # the largest id must survive the round trip
    f = _parse(_write(tmp_path / "v.tok", [[0, top, 1]], vocab=vocab))
    assert f["itemsize"] == itemsize and f["tokens"].tolist() == [0, top, 1]
    d = TokenData.open(tmp_path / "v.tok", vocab)
    assert d.tokens.dtype.itemsize == itemsize and d.documents().tolist() == [0, 3]


def test_a_writer_refuses_an_id_outside_its_vocabulary_and_leaves_no_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="token id 300 is outside the vocabulary of 300"):
        _write(tmp_path / "x.tok", [[1, 2], [300]], vocab=300)
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def good(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    return _write(tmp_path / "good.tok", [rng.integers(0, 299, 50).tolist() for _ in range(20)], vocab=300, eos=299)


def _open_err(path: Path, vocab: int = 300) -> str:
    with pytest.raises(SpecError) as e:
        TokenData.open(path, vocab)
    return str(e.value)


def test_open_refuses_a_truncated_file(good: Path) -> None:
    raw = good.read_bytes()
    good.write_bytes(raw[:-5])
    msg = _open_err(good)
    assert str(good) in msg and f"file is {len(raw) - 5} bytes" in msg and "truncated" in msg, msg
    good.write_bytes(raw[:30])
    msg = _open_err(good)
    assert "shorter than the 64-byte header" in msg, msg


def test_open_refuses_another_format(good: Path) -> None:
    raw = bytearray(good.read_bytes())
    good.write_bytes(b"NOTATOKN" + raw[8:])
    msg = _open_err(good)
    assert str(good) in msg and "not a heteropp token file" in msg, msg
    raw[8:12] = struct.pack("<I", 7)
    good.write_bytes(bytes(raw))
    assert "format version 7 is not supported" in _open_err(good)


def test_open_refuses_a_file_of_a_larger_vocabulary(tmp_path: Path) -> None:
    path = _write(tmp_path / "big.tok", [[1, 70_000]], vocab=70_001)
    msg = _open_err(path, vocab=32_000)
    assert str(path) in msg and "vocabulary of 70001" in msg and "the model has 32000" in msg, msg
    assert TokenData.open(path, 70_001).vocab == 70_001  # and a file of a smaller vocabulary is fine
    assert TokenData.open(path, 128_000).vocab == 70_001


def test_open_refuses_a_missing_file(tmp_path: Path) -> None:
    msg = _open_err(tmp_path / "nope.tok")
    assert "nope.tok" in msg and "cannot be read" in msg, msg


def test_a_corrupted_token_is_named_with_its_file_and_offset(good: Path) -> None:
    k = 417
    raw = bytearray(good.read_bytes())
    raw[64 + 2 * k:64 + 2 * k + 2] = struct.pack("<H", 300)  # one past the vocabulary
    good.write_bytes(bytes(raw))
    d = TokenData.open(good, 300, seq_len=16)
    with pytest.raises(SpecError) as e:  # the whole first epoch in one batch reads every token
        d.rows(seed=0, step=1, sequences=d.num_sequences, seq_len=16, lo=0, hi=d.num_sequences)
    msg = str(e.value)
    assert str(good) in msg and f"tokens[{k}]" in msg and "token id 300" in msg, msg
    assert f"byte offset {64 + 2 * k}" in msg and "ids < 300" in msg, msg


def _mapped_kb(path: Path) -> int:
    """Resident kB of this process's mappings of `path` (/proc/self/smaps): pages the process has touched."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5 and ":" in head[3]:  # a mapping's first line
            inside = line.endswith(str(path))
        elif inside and line.startswith("Rss:"):
            total += int(head[1])
    return total


def _resident_pages(path: Path) -> int:
    """Pages of `path` in the page cache (mincore over a fresh mapping)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
    m = np.memmap(path, dtype=np.uint8, mode="r")
    pages = (m.size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    vec = (ctypes.c_ubyte * pages)()
    assert libc.mincore(m.ctypes.data, m.size, vec) == 0, ctypes.get_errno()
    return sum(v & 1 for v in vec)


def test_rows_touch_only_the_pages_of_their_windows(tmp_path: Path) -> None:
    """A 32 MB file; one step of 8 rows of 257 tokens needs ~4 kB of it."""
    path = tmp_path / "big.tok"
    with TokenWriter(path, vocab=1000) as w:
        block = np.arange(1 << 20, dtype=np.int64) % 1000
        for _ in range(16):
            w.add_document(block)
    # Drop the file from the page cache: the kernel maps whole cached folios (up to MBs) on a fault, but a
    # page read from disk comes with at most its read-around window.
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    if _resident_pages(path) > 16:
        pytest.skip("this file system keeps the file in the page cache (tmpfs?); mapped pages cannot be bounded")
    d = TokenData.open(path, 1000)
    assert _mapped_kb(path) == 0  # opening reads the header with read(), not through the map
    x = d.rows(seed=3, step=5, sequences=8, seq_len=256, lo=0, hi=8)
    assert x.shape == (8, 257)
    touched = _mapped_kb(path)
    # Each window spans at most two 4 kB pages; each page read comes with up to 128 kB of read-around.
    assert 0 < touched <= 8 * 2 * 128, touched
    # The measure sees reads: summing the whole array maps all of it.
    assert int(np.asarray(d.tokens).sum()) > 0
    assert _mapped_kb(path) >= 32 * 1024, _mapped_kb(path)
