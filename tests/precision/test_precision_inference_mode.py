"""Captures of a HuggingFace Llama's forward under torch.inference_mode(), whose tensors keep no
version counter: every hook and mode records it. References: the logits the model returns, float64
torch over the saved outputs, and the C++ hook's capture of the same forward."""
import pytest
import torch

from ditorch_precision import Capture
from ditorch_precision import native
from ditorch_precision.dump import Dump
from ditorch_precision.examples.hf_llama import HFLlamaSize, hf_batches, make_hf_llama

from stats_reference import assert_stats_are_float64_of

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")

SIZE = HFLlamaSize()


def _forward(path, mode, hook):
    model = make_hf_llama(SIZE)
    ids = hf_batches(SIZE, 1)[0]
    with torch.inference_mode(), Capture(str(path), mode=mode, hook=hook, max_bytes=None):
        logits = model(ids).logits
    return Dump.open(str(path)), logits


@pytest.fixture(scope="module")
def captures(tmp_path_factory):
    root = tmp_path_factory.mktemp("inference")
    return {(mode, hook): _forward(root / f"{mode}_{hook}", mode, hook)
            for mode in ("full", "stats") for hook in ("python", "cpp" if native.available() else "python")}


def test_a_full_capture_through_the_python_hook_holds_the_logits(captures):
    full, logits = captures[("full", "python")]
    last = full.load(full.op_records[-1])["outputs"]
    assert torch.equal(last, logits)


def test_a_stats_capture_through_the_python_hook_holds_float64_statistics(captures):
    full, _ = captures[("full", "python")]
    stats, _ = captures[("stats", "python")]
    assert len(stats.op_records) == len(full.op_records) > 50
    checked = 0
    for rs, rf in zip(stats.op_records, full.op_records):
        assert (rs["op"], rs["index"]) == (rf["op"], rf["index"])
        outs = [t for t in torch.utils._pytree.tree_leaves(full.load(rf)["outputs"]) if isinstance(t, torch.Tensor)]
        if all(t.is_floating_point() and t.numel() for t in outs):  # (others: dtype and numel only)
            assert_stats_are_float64_of(rs, rf, full)
            checked += 1
    assert checked > 50


@pytest.mark.skipif(not native.available(), reason="the C++ module is not built")
def test_both_hooks_record_the_same_ops_with_the_same_outputs(captures):
    py, _ = captures[("full", "python")]
    cpp, _ = captures[("full", "cpp")]
    assert [(r["op"], r["index"]) for r in py.op_records] == [(r["op"], r["index"]) for r in cpp.op_records]
    for rp, rc in zip(py.op_records, cpp.op_records):
        a = [t for t in torch.utils._pytree.tree_leaves(py.load(rp)["outputs"]) if isinstance(t, torch.Tensor)]
        b = [t for t in torch.utils._pytree.tree_leaves(cpp.load(rc)["outputs"]) if isinstance(t, torch.Tensor)]
        assert len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b)), rp["op"]
