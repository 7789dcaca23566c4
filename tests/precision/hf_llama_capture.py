"""A captured training run of the small HuggingFace Llama, the run the hook tests compare between the
C++ and the Python op hooks (optionally with a planted 1e-4 fault in layer 0's down_proj)."""
import json
import os

from ditorch_precision import Capture
from ditorch_precision.examples.faults import wrong_kernel
from ditorch_precision.examples.hf_llama import HFLlamaSize, hf_batches, hf_train, make_hf_llama

SIZE = HFLlamaSize()
FAULTY = "LlamaForCausalLM.model.layers.0.mlp.down_proj"


def capture_hf_llama(path, mode: str, hook: str, fault: bool = False, steps: int = 2) -> tuple[str, dict]:
    """Trains `steps` steps under Capture(mode, hook) into `path`; the capture's directory and its meta.json."""
    model = make_hf_llama(SIZE)
    plant = wrong_kernel("mm", 1 + 1e-4 if fault else 1.0, inside=model.model.layers[0].mlp.down_proj)
    with plant, Capture(str(path), mode=mode, hook=hook) as cap:
        hf_train(model, hf_batches(SIZE, steps))
    assert cap.hook_used == hook
    with open(os.path.join(path, "meta.json")) as f:
        meta = json.load(f)
    assert meta["hook"] == hook
    return str(path), meta
