"""`heteropp export`: a checkpoint as a HuggingFace model directory (config.json, model.safetensors and the
tokenizer when given) that `AutoModelForCausalLM.from_pretrained` loads."""
from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import torch

from ..spec import ModelSpec, SpecError
from ..spec.hf import hf_config
from .build import TORCH_DTYPES
from .checkpoint import complete_checkpoints, read_trainer

_HF_DTYPE = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def merged_config(original: dict | None, m: ModelSpec, dtype: str) -> dict:
    """The model's own config.json when the run started from one (token ids, max_position_embeddings, names
    kept), with the architecture fields as trained; else the config these fields make."""
    ours = hf_config(m, _HF_DTYPE[dtype])
    if not original:
        return ours
    out = dict(original)
    keep = {"max_position_embeddings"} & set(original)  # the model's, not the training sequence length
    out.update({k: v for k, v in ours.items() if k not in keep})
    if "rope_parameters" in original:  # transformers 5's form of rope_theta and rope_scaling, kept as it was
        out.pop("rope_theta", None)
        out.pop("rope_scaling", None)
    if "dtype" in original:  # transformers 5 names it dtype, 4.x torch_dtype
        out["dtype"] = out.pop("torch_dtype")
    return out


def export_hf(checkpoint: str | Path, out: str | Path, tokenizer: str | Path | None = None,
              dtype: str = "fp32") -> Path:
    src = Path(checkpoint)
    if not (src / "trainer.json").is_file():
        done = complete_checkpoints(src)
        if not done:
            raise SpecError(str(src), "<checkpoint>", "neither a complete checkpoint nor a directory holding one",
                            "step-NNNNNNNN/ with trainer.json, or the --checkpoint-dir of a run")
        src = done[-1]
    meta = read_trainer(src)
    m = ModelSpec(**meta["model"])
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader
    reader = FileSystemReader(str(src))
    saved = reader.read_metadata().state_dict_metadata
    names = [k for k in saved if not k.startswith("optim.")]
    sd = {k: torch.empty(tuple(saved[k].size), dtype=saved[k].properties.dtype) for k in names}  # type: ignore[union-attr]
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(sd, storage_reader=reader, no_dist=True)
    if m.tie_embeddings:
        sd.pop("lm_head.weight", None)
    from safetensors.torch import save_file
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    save_file({k: v.to(TORCH_DTYPES[dtype]).contiguous() for k, v in sd.items()}, str(d / "model.safetensors"),
              metadata={"format": "pt"})
    (d / "config.json").write_text(json.dumps(merged_config(meta.get("hf_config"), m, dtype), indent=2))
    if tokenizer:
        t = Path(tokenizer)
        t = t / "tokenizer.json" if t.is_dir() else t
        if not t.is_file():
            raise SpecError(str(tokenizer), "--tokenizer", "no tokenizer.json there", "a tokenizer.json file")
        shutil.copyfile(t, d / "tokenizer.json")
    return d
