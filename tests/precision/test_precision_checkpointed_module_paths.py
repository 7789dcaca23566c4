"""A HuggingFace model trained with gradient checkpointing keeps its module paths in a capture.

The recompute runs the checkpointed decoder layers' submodules in backward, with no module around
them; the capture's module tracker took each for a new root and renamed it and its submodules
("LlamaMLP", "LlamaAttention": both layers alike) for the rest of the capture, the next step's forward
included, and recorded a model state for each. The reference: the same model and data without
checkpointing, and the model's own module names."""
import json
import subprocess
import sys

import pytest
import torch

from ditorch_precision import Capture
from ditorch_precision.examples.hf_llama import HFLlamaSize, hf_batches, hf_train_step, make_hf_llama

pytest.importorskip("transformers")
SIZE = HFLlamaSize()


def _records(path, checkpointing: bool, hook: str = "auto") -> list[dict]:
    model = make_hf_llama(SIZE)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with Capture(str(path), mode="stats", hook=hook):
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


@pytest.mark.parametrize("hook", ["auto", "python"])
def test_ops_after_a_checkpointed_backward_are_outside_every_module(tmp_path, hook):
    # Non-reentrant checkpointing stops each layer's recompute once it has what backward needs, by raising
    # out of the innermost module: its return hook never ran (torch calls an always-called global hook
    # without its kwargs there), and the module stayed on the tracker's stack. The next step's loss
    # seed (`ones_like`, outside every module without checkpointing) and everything after it were
    # attributed to `layers.0.mlp.down_proj`, and the compare of this honest pair could not judge them.
    plain, checkpointed = _records(tmp_path / "plain", False, hook), _records(tmp_path / "ckpt", True, hook)

    def outside(records):
        return [(r["op"], r["step"]) for r in records if r["module"] is None and r["phase"] == "forward"
                and not r["op"].startswith(("module::", "optimizer::"))]

    assert outside(plain) and outside(checkpointed) == outside(plain)


def test_a_checkpointed_run_against_a_plain_one_passes(tmp_path):
    _records(tmp_path / "plain", False)
    _records(tmp_path / "ckpt", True)
    p = subprocess.run([sys.executable, "-m", "ditorch_precision.cli", "compare", str(tmp_path / "ckpt"),
                        str(tmp_path / "plain")], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
