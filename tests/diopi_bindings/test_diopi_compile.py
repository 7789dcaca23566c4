"""torch.compile on the native diopi device: a HuggingFace LLaMA (random weights, nothing downloaded)
trained three steps with its forward and backward compiled by the aot_eager backend (graphs of ATen
operators run on the device, each through the library or the CPU fallback). Reference: the same model
trained by plain eager torch on the CPU. Inductor has no code generator for the device: it is refused
with a message naming the device and the way out, not a failure inside inductor."""
from __future__ import annotations

import pytest

from diopi_testlib import run_python

TRAIN_COMPILED = """
    import json, torch
    from diopi_bindings import device
    device.enable({library!r}, backend="native")
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.set_num_threads(1)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)

    def train(where, compiled):
        torch.manual_seed(0)
        model = LlamaForCausalLM(cfg).to(where)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        step_model = torch.compile(model, backend={backend!r}) if compiled else model
        losses = []
        for step in range(3):
            ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(step)).to(where)
            loss = step_model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        return losses

    ref = train("cpu", False)
    try:
        got, error = train("diopi", True), None
    except Exception as exc:
        got, error = None, f"{{type(exc).__name__}}: {{exc}}"
    print(json.dumps({{"ref": ref, "got": got, "error": error, "routed": len(device.routed_ops())}}))
"""


@pytest.mark.slow
def test_a_llama_step_compiled_with_aot_eager_trains_like_eager_cpu(reference_path):
    pytest.importorskip("transformers")
    got = run_python(TRAIN_COMPILED.format(library=str(reference_path), backend="aot_eager"))
    assert got["error"] is None, got["error"]
    mre = sum(abs(g - r) / abs(r) for g, r in zip(got["got"], got["ref"])) / len(got["ref"])
    assert mre < 1e-5, (got["got"], got["ref"])
    assert got["routed"] > 10  # the compiled graphs' operators ran in the library


def test_inductor_is_refused_with_a_clear_message(reference_path):
    pytest.importorskip("transformers")
    got = run_python(TRAIN_COMPILED.format(library=str(reference_path), backend="inductor"))
    assert got["got"] is None
    assert "inductor has no code generator for the diopi device" in got["error"]
    assert 'backend="aot_eager"' in got["error"]
