"""The sampling contract (docs/heteropp-data.md): a step's rows are a pure function of (seed, step, row); any
sub-range, in any process, equals the slice of the whole batch; each epoch covers every window exactly once
(brute force over the raw tokens) in an order that changes from epoch to epoch."""
from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from heteropp.data import TokenData, TokenWriter, sample_windows

SEQ = 8


@pytest.fixture(scope="module")
def tokfile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """1001 random tokens in documents of random lengths: (1001 - 1) // 8 = 125 windows of 9."""
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 500, 1001)
    cuts = np.sort(rng.choice(np.arange(1, 1001), 40, replace=False))
    path = tmp_path_factory.mktemp("sampler") / "t.tok"
    with TokenWriter(path, vocab=500) as w:
        for doc in np.split(ids, cuts):
            w.add_document(doc)
    return path


def _raw_windows(path: Path) -> list[tuple[int, ...]]:
    """Every window as the page defines it, from the file's bytes (tokens start at byte 64)."""
    raw = np.fromfile(path, dtype="<u2", offset=64, count=1001)
    return [tuple(raw[w * SEQ:w * SEQ + SEQ + 1].tolist()) for w in range((len(raw) - 1) // SEQ)]


def _epoch_rows(d: TokenData, seed: int, sequences: int, epoch: int, n: int) -> list[tuple[int, ...]]:
    """Global samples epoch * n .. (epoch + 1) * n - 1, asked for step by step."""
    out = []
    for g in range(epoch * n, (epoch + 1) * n):
        step, r = g // sequences + 1, g % sequences
        out.append(tuple(d.rows(seed, step, sequences, SEQ, r, r + 1)[0].tolist()))
    return out


def test_each_epoch_covers_every_window_once_and_epochs_reshuffle(tokfile: Path) -> None:
    d = TokenData.open(tokfile, 500, seq_len=SEQ)
    windows = _raw_windows(tokfile)
    n = d.num_sequences
    assert n == len(windows) == 125
    sequences = 7  # does not divide n: epochs change within a step
    epochs = [_epoch_rows(d, 11, sequences, e, n) for e in range(3)]
    for rows in epochs:
        assert Counter(rows) == Counter(windows)
    order = [[windows.index(r) for r in rows] for rows in epochs]
    assert order[0] != order[1] != order[2] != order[0]
    assert order[0] != sorted(order[0])  # shuffled, not file order
    # The windows' own indices, brute force: a permutation of range(n) per epoch.
    for e in range(3):
        idx = np.concatenate([sample_windows(11, s, sequences, 0, sequences, n)
                              for s in range(1, 3 * n // sequences + 2)])[e * n:(e + 1) * n]
        assert sorted(idx.tolist()) == list(range(n))
    # Another seed, another order.
    assert _epoch_rows(d, 12, sequences, 0, n) != epochs[0]


def test_a_sub_range_is_the_slice_of_the_whole_batch(tokfile: Path) -> None:
    d = TokenData.open(tokfile, 500)
    for step in (1, 2, 17, 40):  # step 40 of 16 rows reaches epoch 4
        whole = d.rows(5, step, 16, SEQ, 0, 16)
        assert whole.dtype == torch.int64 and whole.shape == (16, SEQ + 1)
        for lo, hi in [(0, 4), (4, 8), (3, 11), (15, 16), (7, 7)]:
            torch.testing.assert_close(d.rows(5, step, 16, SEQ, lo, hi), whole[lo:hi], rtol=0, atol=0)
        # inputs [:, :-1] and targets [:, 1:] are consecutive tokens of the file
        raw = _raw_windows(tokfile)
        assert all(tuple(r) in raw for r in whole.tolist())


_CHILD = """
import json, sys
from heteropp.data import TokenData
path, lo, hi = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
d = TokenData.open(path, 500)
print(json.dumps({s: d.rows(9, s, 12, 8, lo, hi).tolist() for s in (1, 2, 30)}))
"""


def test_replicas_in_their_own_processes_see_the_reference_batch(tokfile: Path) -> None:
    """Replica 1 reads its half of a 12-row batch in its own process while replica 0 reads its half here;
    together they are the batch one process reads whole."""
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(tokfile), "6", "12"], stdout=subprocess.PIPE,
                             text=True)
    mine = TokenData.open(tokfile, 500)
    first = {s: mine.rows(9, s, 12, SEQ, 0, 6).tolist() for s in (1, 2, 30)}
    out, _ = child.communicate(timeout=120)
    assert child.returncode == 0
    second = json.loads(out)
    d = TokenData.open(tokfile, 500)
    for s in (1, 2, 30):
        assert first[s] + second[str(s)] == d.rows(9, s, 12, SEQ, 0, 12).tolist()
        assert first[s] != second[str(s)]


def test_a_bad_request_is_refused(tokfile: Path) -> None:
    d = TokenData.open(tokfile, 500)
    with pytest.raises(ValueError, match="step counts from 1"):
        d.rows(0, 0, 4, SEQ, 0, 4)
    with pytest.raises(ValueError, match=r"rows \[2, 5\) are not within a batch of 4"):
        d.rows(0, 1, 4, SEQ, 2, 5)
    assert d.rows(0, 1, 4, 1000, 0, 4).shape == (4, 1001)  # one window, drawn every time
    with pytest.raises(ValueError, match="1001 tokens hold no sequence of seq_len \\+ 1 = 1002"):
        d.rows(0, 1, 4, 1001, 0, 4)
    with pytest.raises(ValueError, match="num_sequences needs the sequence length"):
        _ = d.num_sequences
