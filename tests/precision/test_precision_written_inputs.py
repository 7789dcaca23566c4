"""A full capture of an op that writes an argument copies what it writes (its state before the op) and
keeps its other inputs as they are: the op leaves them unchanged. References: the values torch computes,
and the part file's own storage table."""
import glob
import json
import struct

import pytest
import torch

from ditorch_precision import Capture
from ditorch_precision.dump import Dump


def _storages(path):
    """(storage count, bytes) over the capture's part files, read from their headers."""
    count = nbytes = 0
    for part in glob.glob(f"{path}/tensors/part*.bin"):
        with open(part, "rb") as f:
            header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
        count += len(header["storages"])
        nbytes += sum(n for _, n in header["storages"])
    return count, nbytes


@pytest.mark.parametrize("hook", ["python", "cpp"])
def test_an_in_place_op_holds_its_unwritten_inputs_once(tmp_path, hook):
    from ditorch_precision import native
    if hook == "cpp" and not native.available():
        pytest.skip(f"the C++ module is not built ({native.why_not()})")
    torch.manual_seed(0)
    x, g = torch.randn(256), torch.randn(256)
    before = x.clone()
    with Capture(str(tmp_path), hook=hook, max_bytes=None):
        x.addcmul_(g, g, value=0.5)  # as AdamW's second moment: the gradient passed twice
    dump = Dump.open(str(tmp_path))
    (rec,) = [r for r in dump.op_records if r["op"] == "aten::addcmul_"]
    saved = dump.load(rec)
    a, b, c = saved["args"]
    assert torch.equal(a, before) and torch.equal(b, g) and torch.equal(c, g)
    assert torch.equal(saved["outputs"], torch.addcmul(before, g, g, value=0.5)) and torch.equal(saved["outputs"], x)
    # x before the op, g once, x after it: 3 storages of 1 KiB (not g copied for each place it is passed)
    assert _storages(tmp_path) == (3, 3 * 256 * 4)


@pytest.mark.parametrize("hook", ["python", "cpp"])
def test_the_copy_that_guards_a_held_tensor_is_the_writing_ops_copy_of_its_input(tmp_path, hook):
    from ditorch_precision import native
    if hook == "cpp" and not native.available():
        pytest.skip(f"the C++ module is not built ({native.why_not()})")
    torch.manual_seed(0)
    x = torch.randn(256)
    before = x.clone()
    with Capture(str(tmp_path), hook=hook, max_bytes=None):
        y = x * 2  # holds x uncopied until the part is written
        x.mul_(3)  # copies the held x first: that copy is also mul_'s input before it ran
    dump = Dump.open(str(tmp_path))
    (mul,) = [dump.load(r) for r in dump.op_records if r["op"] == "aten::mul"]
    (mul_,) = [dump.load(r) for r in dump.op_records if r["op"] == "aten::mul_"]
    assert torch.equal(mul["args"][0], before) and torch.equal(mul["outputs"], y)
    assert torch.equal(mul_["args"][0], before) and torch.equal(mul_["outputs"], torch.mul(before, 3))
    assert _storages(tmp_path) == (3, 3 * 256 * 4)  # x before (once), y, x after
