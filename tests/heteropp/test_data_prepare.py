"""`heteropp data prepare` against tokenizing with HF `tokenizers` directly: this repository's docs/*.md and a
JSON-lines file, a tokenizer trained locally in the test, a model directory's eos_token, a > 65,536-id
vocabulary (uint32), and memory that stays bounded while the corpus streams through."""
from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from heteropp.data import TokenData
from heteropp.data.prepare import prepare
from heteropp.data.tokenizer import EOS_TOKEN, train_tokenizer
from heteropp.spec import SpecError

DOCS = sorted((Path(__file__).resolve().parents[2] / "docs").glob("*.md"))


@pytest.fixture(scope="module")
def tok_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    train_tokenizer([str(p) for p in DOCS[:4]], out, vocab_size=400)
    return out


def _paragraphs(text: str) -> list[str]:
    """The documented rule, independently: maximal runs of non-blank lines, their line ends kept inside."""
    lines = text.splitlines(keepends=True)
    runs = [list(g) for blank, g in itertools.groupby(lines, key=lambda s: not s.strip()) if not blank]
    return ["".join(r).rstrip("\r\n") for r in runs]


def _file_tokens(path: Path) -> tuple[list[int], list[int], dict]:
    raw = path.read_bytes()
    itemsize, vocab, eos, ntok, ndoc, docs_off = (int.from_bytes(raw[a:b], "little", signed=signed) for a, b, signed in
                                                  [(12, 16, 0), (16, 24, 0), (24, 32, 1), (32, 40, 0), (40, 48, 0),
                                                   (48, 56, 0)])
    tokens = np.frombuffer(raw, dtype=f"<u{itemsize}", count=ntok, offset=64).tolist()
    docs = np.frombuffer(raw, dtype="<u8", count=ndoc + 1, offset=docs_off).tolist()
    return tokens, docs, {"itemsize": itemsize, "vocab": vocab, "eos": eos}


def test_docs_round_trip_against_tokenizers(tok_path: Path, tmp_path: Path) -> None:
    tok = Tokenizer.from_file(str(tok_path))
    eos = tok.token_to_id(EOS_TOKEN)
    docs = [p for f in DOCS for p in _paragraphs(f.read_text(encoding="utf-8"))]
    want = [tok.encode(d, add_special_tokens=False).ids + [eos] for d in docs]
    out = tmp_path / "docs.tok"
    # Small batches: many flushes, documents split across them.
    r = prepare(tok_path, out, [str(p) for p in DOCS], progress=None, batch_docs=37, batch_chars=5000)
    tokens, index, head = _file_tokens(out)
    assert head == {"itemsize": 2, "vocab": 400, "eos": eos}
    assert tokens == [t for w in want for t in w]
    assert index == [0, *itertools.accumulate(len(w) for w in want)]
    assert (r.num_tokens, r.num_docs) == (len(tokens), len(want))
    assert not [p for p in tmp_path.iterdir() if p.name != "docs.tok"]  # no temporary left behind
    d = TokenData.open(out, 400, seq_len=64)
    assert d.num_sequences == (len(tokens) - 1) // 64
    assert d.rows(0, 1, 2, 64, 0, 2).max() < 400


def test_jsonl_with_a_named_field(tok_path: Path, tmp_path: Path) -> None:
    tok = Tokenizer.from_file(str(tok_path))
    texts = ["Pipeline stages\n\nexchange activations.", "", "ünïcödé ✓ text", "last one"]
    src = tmp_path / "c.jsonl"
    src.write_text("\n".join(json.dumps({"body": t, "id": i}) for i, t in enumerate(texts)) + "\n\n",
                   encoding="utf-8")
    prepare(tok_path, tmp_path / "c.tok", [str(src)], jsonl_field="body", eos="none", progress=None)
    tokens, index, head = _file_tokens(tmp_path / "c.tok")
    want = [tok.encode(t, add_special_tokens=False).ids for t in texts if t]  # empty documents are skipped
    assert head["eos"] == -1 and tokens == [t for w in want for t in w]
    assert index == [0, *itertools.accumulate(len(w) for w in want)]


def _word_level(vocab: dict[str, int]) -> Tokenizer:
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tok


def test_a_vocabulary_over_65536_ids_gives_uint32(tmp_path: Path) -> None:
    words = {f"w{i}": i for i in range(70_000)} | {"<unk>": 70_000, "</s>": 70_001}
    _word_level(words).save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "in.txt").write_text("w1 w69999 w65536\nw3\n\nw0 nope\n")
    prepare(tmp_path / "tokenizer.json", tmp_path / "o.tok", [str(tmp_path / "in.txt")], progress=None)
    tokens, index, head = _file_tokens(tmp_path / "o.tok")
    assert head == {"itemsize": 4, "vocab": 70_002, "eos": 70_001}  # "</s>" is a known end-of-document name
    assert tokens == [1, 69999, 65536, 3, 70_001, 0, 70_000, 70_001] and index == [0, 5, 8]


def test_a_model_directory_and_its_eos_token(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    _word_level({"a": 0, "b": 1, "</s>": 2, "<|endoftext|>": 3, "<unk>": 4}).save(str(model / "tokenizer.json"))
    # The directory's tokenizer_config.json wins over the names known by default ("</s>" would come first).
    (model / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "<|endoftext|>"}}))
    (tmp_path / "in.txt").write_text("a b\n\nb\n")
    prepare(model, tmp_path / "o.tok", [str(tmp_path / "in.txt")], progress=None)
    assert _file_tokens(tmp_path / "o.tok")[0] == [0, 1, 3, 1, 3]
    prepare(model, tmp_path / "p.tok", [str(tmp_path / "in.txt")], eos="2", progress=None)
    assert _file_tokens(tmp_path / "p.tok")[0] == [0, 1, 2, 1, 2]


def test_a_failure_midway_leaves_no_output(tok_path: Path, tmp_path: Path) -> None:
    src = tmp_path / "c.jsonl"
    src.write_text(json.dumps({"text": "fine"}) + "\n" + json.dumps({"txt": "typo"}) + "\n")
    out = tmp_path / "o.tok"
    with pytest.raises(SpecError, match=r"c.jsonl:2: field 'text': missing"):
        prepare(tok_path, out, [str(src)], progress=None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl"]


_MEMORY = """
import sys
from pathlib import Path
from heteropp.data.prepare import iter_documents, load_tokenizer, prepare
tok_path, corpus, out = sys.argv[1:]
def rss():  # peak RSS of this process in MB (VmHWM; ru_maxrss would carry the parent's peak over exec)
    return next(int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmHWM:")) / 1024
tok = load_tokenizer(tok_path)
base = rss()
prepare(tok_path, out, [corpus], progress=None, batch_chars=1 << 16)
streaming = rss() - base
tok.encode_batch(list(iter_documents([Path(corpus)])), add_special_tokens=False)  # the corpus held at once
print(streaming, rss() - base)
"""


def test_memory_stays_bounded_while_the_corpus_streams(tok_path: Path, tmp_path: Path) -> None:
    """A 1 MB corpus: streaming grows the peak RSS by a fraction of what holding its encodings would."""
    corpus = tmp_path / "corpus.txt"
    text = "\n\n".join(f.read_text(encoding="utf-8") for f in DOCS)
    corpus.write_text(text * (1_000_000 // len(text) + 1))
    done = subprocess.run([sys.executable, "-c", _MEMORY, str(tok_path), str(corpus), str(tmp_path / "o.tok")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    streaming, whole = map(float, done.stdout.split())
    print(f"peak RSS growth: streaming {streaming:.0f} MB, whole corpus {whole:.0f} MB")
    assert whole > 50 and streaming < whole / 4, (streaming, whole)
