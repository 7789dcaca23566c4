"""The safetensors reader behind `--model DIR`: slices straight into the parameters, any dtype into any, with
a forged header refused before a byte is used and a rank's memory at its shard plus one block while loading.
The reference for the values is the safetensors library's own loader."""
from __future__ import annotations

import json
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from heteropp.model import StageModel, TPGroup
from heteropp.model.hf_weights import load_hf_weights
from heteropp.model.init import skip_init
from heteropp.spec import SpecError, load_model
from heteropp.spec.hf import hf_name

from .hf_models import write_hf_model


def _stage(d: Path, tp: TPGroup, dtype: torch.dtype) -> tuple[StageModel, object]:
    m = load_model(d)
    with skip_init():
        chunk = StageModel(m, range(m.layers), tp, seed=0, first=True, last=True, recompute=False)
    chunk = chunk.to(dtype)
    load_hf_weights([chunk], m, d, tp.rank, tp.size)
    return chunk, m


@pytest.mark.parametrize("file_dtype,param_dtype", [(torch.bfloat16, torch.float32), (torch.float32, torch.bfloat16),
                                                    (torch.float32, torch.float32)])
def test_tp_slices_in_any_dtype_put_back_together_are_the_file(tmp_path, file_dtype, param_dtype) -> None:
    d = write_hf_model(tmp_path / "m", "llama")
    f = d / "model.safetensors"
    want = {k: v.to(file_dtype) for k, v in load_file(f).items()}
    save_file(want, f, metadata={"format": "pt"})
    ranks = [_stage(d, TPGroup(rank=r, size=2), param_dtype) for r in range(2)]
    m = ranks[0][1]
    for (name, p0), (_, p1) in zip(ranks[0][0].named_parameters(), ranks[1][0].named_parameters()):
        full = want[hf_name(name, m)].to(param_dtype)
        assert getattr(p0, "tp_replicas", 1) == 1  # 2 K/V heads over TP 2: no replicated slices here
        dim = p0.shard_dim
        got = p0.detach() if dim is None else torch.cat([p0.detach(), p1.detach()], dim)
        torch.testing.assert_close(got, full, rtol=0, atol=0, msg=name)


def _forge(path: Path, edit) -> None:
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    new = edit(head, raw)
    if isinstance(new, bytes):
        path.write_bytes(new)
        return
    body = json.dumps(head).encode()
    path.write_bytes(struct.pack("<Q", len(body)) + body + raw[8 + n:])


def _first(head: dict) -> dict:
    return next(v for k, v in head.items() if k != "__metadata__")


FORGERIES = {
    "header longer than the file": (lambda h, raw: struct.pack("<Q", 1 << 40) + raw[8:], "header of"),
    "offsets past the end": (lambda h, raw: _first(h).update(data_offsets=[0, 1 << 40]), "truncated"),
    "offsets that do not match the shape": (lambda h, raw: _first(h).update(
        data_offsets=[_first(h)["data_offsets"][0], _first(h)["data_offsets"][1] - 4]), "for shape"),
    "a negative dimension": (lambda h, raw: _first(h).update(shape=[-1, 64]), "negative"),
    "an unknown dtype": (lambda h, raw: _first(h).update(dtype="F8_E4M3"), "dtype F8_E4M3"),
    "a header that is not JSON": (lambda h, raw: raw[:8] + b"\xff" * (len(raw) - 8), "not JSON"),
    "eight bytes": (lambda h, raw: raw[:8], "header of"),
}


@pytest.mark.parametrize("what", list(FORGERIES))
def test_a_forged_header_is_refused_naming_the_file(tmp_path, what) -> None:
    d = write_hf_model(tmp_path / "m", "llama")
    edit, message = FORGERIES[what]
    _forge(d / "model.safetensors", edit)
    with pytest.raises(SpecError, match=f"model.safetensors.*{message}"):
        _stage(d, TPGroup(), torch.float32)


def test_loading_holds_the_shard_and_one_block_not_a_whole_tensor(tmp_path) -> None:
    """A 98 MB embedding and head (the model's largest tensors) loaded by TP rank 0 of 2 in a fresh process,
    its parameters already resident: the peak resident set while loading grows by at most the reader's block
    (twice, with slack), not by a copy or a mapping of a whole slice (it grew by 51 MB, about the largest
    slice, before)."""
    d = write_hf_model(tmp_path / "m", "llama", vocab_size=96_000, hidden_size=256, intermediate_size=256,
                       num_hidden_layers=1)
    code = textwrap.dedent(f"""
        import torch
        from heteropp.model import StageModel, TPGroup
        from heteropp.model.hf_weights import load_hf_weights, BLOCK_BYTES
        from heteropp.model.init import skip_init
        from heteropp.spec import load_model
        def status(k):
            for line in open("/proc/self/status"):
                if line.startswith(k):
                    return int(line.split()[1]) * 1024
        m = load_model({str(d)!r})
        with skip_init():
            chunk = StageModel(m, range(m.layers), TPGroup(rank=0, size=2), seed=0, first=True, last=True,
                               recompute=False)
        shard = sum(p.numel() * p.element_size() for p in chunk.parameters())
        for p in chunk.parameters():
            p.data.zero_()  # resident before the measurement: what remains is what the reader holds
        open("/proc/self/clear_refs", "w").write("5")
        before = status("VmRSS:")
        load_hf_weights([chunk], m, {str(d)!r}, 0, 2)
        print(shard, status("VmHWM:") - before, BLOCK_BYTES)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    shard, grew, block = map(int, out.stdout.split())
    largest = 96_000 * 256 * 4 // 2
    assert grew <= 2 * block + (8 << 20) < largest, (
        f"loading grew the resident set by {grew / 1e6:.0f} MB beside a {shard / 1e6:.0f} MB shard "
        f"(largest slice {largest / 1e6:.0f} MB)")
