"""HuggingFace safetensors weights into a stage's parameters, each rank reading only its own slices.

safetensors memory-maps the file and `get_slice` reads just the requested rows or columns, so a rank's
resident memory stays close to its shard. One file (`model.safetensors`) or a sharded checkpoint
(`model.safetensors.index.json` naming each tensor's file) is read; every tensor's full shape is checked
against the model's config before any byte of it is used.
"""
from __future__ import annotations

import json
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


def _open(path: Path):
    from safetensors import safe_open
    try:
        return safe_open(str(path), framework="pt")
    except Exception as e:  # a truncated or corrupted file: safetensors checks its header against the size
        raise SpecError(str(path), "<file>", f"not a readable safetensors file ({e})",
                        "a complete safetensors file") from None


def _keys(path: Path) -> list[str]:
    with _open(path) as f:
        return list(f.keys())


@torch.no_grad()
def load_hf_weights(models: list[nn.Module], m: ModelSpec, directory: str | Path, tp_rank: int, tp_size: int) -> int:
    """Copy each parameter's slice from the HF checkpoint in `directory`; returns the bytes read."""
    files = weight_files(directory)
    if files is None:
        raise SpecError(str(directory), "<weights>", "no model.safetensors or model.safetensors.index.json",
                        "a HF model directory with safetensors weights (or train from a fresh initialisation)")
    read = 0
    for model in models:
        for name, p in model.named_parameters():
            key = hf_name(name, m)
            if key not in files:
                raise SpecError(str(directory), key, "tensor missing from the checkpoint",
                                f"the weights of the config's {m.layers}-layer model")
            path = files[key]
            # one mapping per tensor: its pages leave this process's memory when it is unmapped, so the
            # file's pages never add up beside the shard being built
            with _open(path) as f:
                sl = f.get_slice(key)
                full, dim, a, b = global_slice(p, tp_rank, tp_size)
                if tuple(sl.get_shape()) != full:
                    raise SpecError(str(path), key, f"shape {list(sl.get_shape())}",
                                    f"{list(full)} as config.json describes the model")
                index = tuple(slice(None) for _ in range(dim or 0)) + (slice(a, b),) if dim is not None else ()
                t = sl[index] if index else sl[:]
                p.copy_(t.to(p.dtype))
                read += t.numel() * t.element_size()
    return read
