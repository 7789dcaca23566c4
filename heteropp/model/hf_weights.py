"""HuggingFace safetensors weights into a stage's parameters, each rank reading only its own slices.

The safetensors layout is read here (an 8-byte header length, a JSON header giving each tensor's dtype, shape
and byte range, then the data) and each slice is read with positioned reads, a bounded block of rows at a time,
straight into the parameter (converting the dtype block by block): a rank's resident memory is its shard plus
one block, never a whole tensor (a memory map's pages count in the resident set while mapped, and a slice taken
from it is a copy beside the parameter). One file (`model.safetensors`) or a sharded checkpoint
(`model.safetensors.index.json` naming each tensor's file) is read. The header is untrusted: its length, every
dtype, shape and byte range are checked against the file before a byte is used, and every tensor's full shape
against the model's config.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import nn

from ..spec import ModelSpec, SpecError
from ..spec.hf import hf_name
from .init import global_slice

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


def weight_files(directory: str | Path) -> dict[str, Path] | None:
    """HF tensor name -> the safetensors file holding it; None when the directory has no weights."""
    d = Path(directory)
    if (d / INDEX).is_file():
        src = str(d / INDEX)
        try:
            index = json.loads((d / INDEX).read_text())
            mapping = index["weight_map"]
            if not isinstance(mapping, dict) or not all(isinstance(v, str) for v in mapping.values()):
                raise ValueError("weight_map is not a mapping of names to file names")
        except (ValueError, KeyError, TypeError) as e:
            raise SpecError(src, "weight_map", f"unreadable index: {e}", "a HF sharded-checkpoint index") from None
        files = {}
        for name, fname in mapping.items():
            p = (d / fname)
            if Path(fname).name != fname or not p.is_file():  # names inside the directory only
                raise SpecError(src, f"weight_map.{name}", f"file {fname!r} is not in {d}", "a file beside the index")
            files[name] = p
        return files
    if (d / SINGLE).is_file():
        return {name: d / SINGLE for name in _keys(d / SINGLE)}
    return None


BLOCK_BYTES = 8 << 20  # rows read at a time: the most a load holds beside the shard
MAX_HEADER = 100 << 20
DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


class _Entry:
    def __init__(self, dtype: torch.dtype, shape: tuple[int, ...], start: int) -> None:
        self.dtype, self.shape, self.start = dtype, shape, start


def _header(path: Path) -> dict[str, _Entry]:
    """Tensor name -> dtype, shape and absolute byte offset, every field checked against the file's size."""
    def bad(what: str) -> SpecError:
        return SpecError(str(path), "<file>", f"not a readable safetensors file ({what})",
                         "a complete safetensors file")

    size = path.stat().st_size
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise bad(f"{size} bytes, shorter than the header length")
        n = int.from_bytes(raw, "little")
        if n > min(MAX_HEADER, size - 8):
            raise bad(f"header of {n} bytes in a file of {size}")
        try:
            head = json.loads(f.read(n))
        except ValueError as e:
            raise bad(f"header is not JSON: {e}") from None
    if not isinstance(head, dict):
        raise bad("header is not a JSON object")
    data_size, out = size - 8 - n, {}
    for name, e in head.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (a, b) = e["dtype"], tuple(e["shape"]), e["data_offsets"]
            if not all(isinstance(x, int) and x >= 0 for x in (*shape, a, b)):
                raise TypeError("negative or non-integer shape or offsets")
        except (KeyError, TypeError, ValueError) as err:
            raise bad(f"entry {name!r}: {err}") from None
        if dtype not in DTYPES:
            raise SpecError(str(path), name, f"dtype {dtype}", f"one of {', '.join(DTYPES)}")
        numel = 1
        for d in shape:
            numel *= d
        if not a <= b <= data_size or b - a != numel * DTYPES[dtype].itemsize:
            raise bad(f"tensor {name!r} at bytes [{a}, {b}) of {data_size} for shape {list(shape)} {dtype}"
                      + (": truncated" if b > data_size else ""))
        out[name] = _Entry(DTYPES[dtype], shape, 8 + n + a)
    return out


def _keys(path: Path) -> list[str]:
    return list(_header(path))


def _read_slice(path: Path, e: _Entry, dim: int | None, a: int, b: int, out: torch.Tensor,
                scratch: torch.Tensor) -> int:
    """Copy e[..., a:b along dim] (the whole tensor when dim is None) into `out`; returns the bytes read. Whole
    rows of the tensor viewed as (rows, row length), restricted to rows [a, b) for dim 0, a block at a time."""
    lead = e.shape[0] if e.shape else 1
    row = 1
    for d in e.shape[1:]:
        row *= d
    r0, r1 = (a, b) if dim == 0 else (0, lead)
    item = e.dtype.itemsize
    per = max(1, scratch.numel() // max(1, row * item))
    dst = out.reshape(r1 - r0, -1) if dim in (None, 0) else out.reshape(lead, -1)
    cols = slice(None) if dim in (None, 0) else None
    inner = 1
    if dim is not None and dim > 0:  # columns [a, b) of dimension `dim` inside each row
        for d in e.shape[dim + 1:]:
            inner *= d
        outer = row // (e.shape[dim] * inner)
    if not out.is_contiguous():
        raise ValueError("a parameter to load into must be contiguous")
    read = 0
    with open(path, "rb", buffering=0) as f:
        for r in range(r0, r1, per):
            k = min(per, r1 - r)
            buf = scratch[:k * row * item] if k * row * item <= scratch.numel() else \
                torch.empty(k * row * item, dtype=torch.uint8)  # one row longer than the block
            got = os.preadv(f.fileno(), [memoryview(buf.numpy())], e.start + r * row * item)
            if got != k * row * item:
                raise SpecError(str(path), "<file>", f"not a readable safetensors file (short read at row {r})",
                                "a complete safetensors file")
            block = buf.view(e.dtype).reshape(k, row)
            if cols is None:
                block = block.reshape(k, outer, e.shape[dim], inner)[:, :, a:b, :].reshape(k, -1)
            dst[r - r0:r - r0 + k].copy_(block)
            read += got
    return read


@torch.no_grad()
def load_hf_weights(models: list[nn.Module], m: ModelSpec, directory: str | Path, tp_rank: int, tp_size: int) -> int:
    """Copy each parameter's slice from the HF checkpoint in `directory`; returns the bytes read."""
    files = weight_files(directory)
    if files is None:
        raise SpecError(str(directory), "<weights>", "no model.safetensors or model.safetensors.index.json",
                        "a HF model directory with safetensors weights (or train from a fresh initialisation)")
    headers: dict[Path, dict[str, _Entry]] = {}
    scratch = torch.empty(BLOCK_BYTES, dtype=torch.uint8)  # one block for the whole load, given back after
    read = 0
    for model in models:
        for name, p in model.named_parameters():
            key = hf_name(name, m)
            if key not in files:
                raise SpecError(str(directory), key, "tensor missing from the checkpoint",
                                f"the weights of the config's {m.layers}-layer model")
            path = files[key]
            if path not in headers:
                headers[path] = _header(path)
            e = headers[path].get(key)
            if e is None:
                raise SpecError(str(path), key, "tensor missing from this file", "the file the index names for it")
            full, dim, a, b = global_slice(p, tp_rank, tp_size)
            if e.shape != tuple(full):
                raise SpecError(str(path), key, f"shape {list(e.shape)}",
                                f"{list(full)} as config.json describes the model")
            read += _read_slice(path, e, dim, a, b, p.data, scratch)
    return read
