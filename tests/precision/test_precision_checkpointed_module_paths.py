"""A HuggingFace model trained with gradient checkpointing keeps its module paths in a capture.

The recompute runs the checkpointed decoder layers' submodules in backward, with no module around
them; the capture's module tracker took each for a new root and renamed it and its submodules
("LlamaMLP", "LlamaAttention": both layers alike) for the rest of the capture, the next step's forward
included, and recorded a model state for each. The reference: the same model and data without
checkpointing, and the model's own module names."""
import json

import pytest
import torch

from ditorch_precision import Capture
from ditorch_precision.examples.hf_llama import HFLlamaSize, hf_batches, hf_train_step, make_hf_llama

pytest.importorskip("transformers")
SIZE = HFLlamaSize()


def _records(path, checkpointing: bool) -> list[dict]:
    model = make_hf_llama(SIZE)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with Capture(str(path), mode="stats"):
        for ids in hf_batches(SIZE, 2):
            hf_train_step(model, opt, ids)
    with open(path / "index.jsonl") as f:
        return [json.loads(line) for line in f]


def test_a_checkpointed_models_ops_keep_their_module_paths(tmp_path):
    plain, checkpointed = _records(tmp_path / "plain", False), _records(tmp_path / "ckpt", True)
    names = {f"LlamaForCausalLM.{n}" if n else "LlamaForCausalLM" for n, _ in make_hf_llama(SIZE).named_modules()}
    modules = {r["module"] for r in checkpointed if r["module"]}
    assert modules <= names, sorted(modules - names)  # "LlamaMLP", "LlamaAttention", ... before
    # the recompute runs in the checkpointed layers' own submodules, by their full paths
    recomputed = {r["module"] for r in checkpointed if r["phase"] == "recompute"}
    assert any(m.startswith("LlamaForCausalLM.model.layers.1.mlp") for m in recomputed), sorted(recomputed)

    def forward(records, step):
        return {r["module"] for r in records if r["phase"] == "forward" and r["step"] == step and r["module"]}

    # the second step's forward runs in the same modules as without checkpointing (HF's checkpointed
    # forward runs a few other ops); they were renamed by the first backward
    assert forward(checkpointed, 1) == forward(plain, 1)
    assert [r["module"] for r in checkpointed if r["op"] == "module::state"] == ["LlamaForCausalLM"]
