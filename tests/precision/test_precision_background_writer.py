"""A bulk capture's part files are saved on a thread of their own: nothing is lost, after a normal
exit or an exception in the training loop, and a tensor a part being written holds is not changed
under it. References: the per-op capture of the same run (written on the training thread, one file
per op) and plain torch. HuggingFace LlamaForCausalLM on CPU standing in for the device."""
import pytest
import torch
from torch.utils._pytree import tree_leaves

from ditorch_precision import Capture, Selector
from ditorch_precision.dump import Dump, Unsaved
from ditorch_precision.examples.hf_llama import HFLlamaSize, hf_batches, hf_train_step, make_hf_llama

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")

SIZE = HFLlamaSize()


class Stop(Exception):
    pass


def _train(path, steps, fail_in_step=None, **capture):
    """``steps`` AdamW steps of a fresh model under a capture; ``fail_in_step``: raise after that
    step's backward (its optimizer step not taken), inside the capture."""
    model = make_hf_llama(SIZE)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with Capture(str(path), **capture):
        for step, ids in enumerate(hf_batches(SIZE, steps)):
            if step == fail_in_step:
                opt.zero_grad(set_to_none=True)
                model(input_ids=ids, labels=ids).loss.backward()
                raise Stop
            hf_train_step(model, opt, ids)


def _same_capture(bg: Dump, ref: Dump) -> None:
    assert bg.meta["bulk"] and not ref.meta["bulk"]
    assert [(r["index"], r["op"]) for r in bg.records] == [(r["index"], r["op"]) for r in ref.records]
    for rb, rr in zip(bg.records, ref.records):
        assert rb.get("file") is not None, (rb["op"], rb["index"])  # every op's tensors were written
        lb, lr = tree_leaves(bg.load(rb)), tree_leaves(ref.load(rr))
        assert len(lb) == len(lr), (rb["op"], rb["index"])
        for x, y in zip(lb, lr):
            if isinstance(x, torch.Tensor):
                assert isinstance(y, torch.Tensor) and torch.equal(x, y), (rb["op"], rb["index"])
            elif isinstance(x, Unsaved):  # a generator object: its repr names its address
                assert isinstance(y, Unsaved) and x.text.split(" at ")[0] == y.text.split(" at ")[0]
            else:
                assert x == y


def test_background_writer_loses_nothing_after_a_normal_exit(tmp_path):
    _train(tmp_path / "bg", 3, bulk=True)
    _train(tmp_path / "ref", 3, bulk=False)
    bg, ref = Dump.open(str(tmp_path / "bg")), Dump.open(str(tmp_path / "ref"))
    assert len({r["file"] for r in bg.records}) == 3  # one part per step, each written off the training thread
    _same_capture(bg, ref)


def test_background_writer_loses_nothing_after_an_exception_in_the_training_loop(tmp_path):
    with pytest.raises(Stop):
        _train(tmp_path / "bg", 3, fail_in_step=2, bulk=True)
    with pytest.raises(Stop):
        _train(tmp_path / "ref", 3, fail_in_step=2, bulk=False)
    bg, ref = Dump.open(str(tmp_path / "bg")), Dump.open(str(tmp_path / "ref"))
    assert {r["step"] for r in bg.records} == {0, 1, 2}  # the interrupted step's forward and backward too
    _same_capture(bg, ref)


def test_a_tensor_a_part_being_written_holds_is_not_changed_under_it(tmp_path):
    """The part of step 0 holds x uncopied; step 1 writes x in place at once. The write waits for
    the part: the file holds x as it was."""
    x = torch.ones(4 << 20)
    with Capture(str(tmp_path / "c"), Selector.build(ops="mul"), bulk=True) as cap:
        y = x * 2
        cap.step()  # the part of step 0 goes to the writer
        x.add_(1)  # not captured (no mul), but it writes what that part holds
        del y
    dump = Dump.open(str(tmp_path / "c"))
    (rec,) = dump.records
    data = dump.load(rec)
    n = 4 << 20
    assert torch.equal(data["args"][0], torch.ones(n)) and torch.equal(data["outputs"], torch.full((n,), 2.0))
