"""A full capture (tensor files, what a compare replays) through the C++ observer: its records and
the tensors its part files hold must be what the Python hook's full capture of the same run holds
(the Python hook is the reference), on a HuggingFace Llama training run and on a program of the
argument kinds a payload holds (tensor lists, keyword-only arguments, dtypes, memory formats,
several and no returns, in-place writes of tensors kept uncopied, uninitialised memory); a planted
fault must be found at the same op, and a part file that cannot be written is an error."""
import os
from collections import defaultdict

import pytest
import torch
from torch.utils._pytree import tree_flatten

from ditorch_precision import Capture, compare_dumps, native, native_hook
from ditorch_precision.cli import main
from ditorch_precision.dump import Dump, Unsaved
from hf_llama_capture import FAULTY, capture_hf_llama

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.skipif(not native.available(), reason=f"C++ module not built: {native.why_not()}")]

PLACE = ("index", "file", "key")  # where a record's tensors lie, not what they are


def _llama(path, hook, fault=False) -> str:
    path, meta = capture_hf_llama(path, "full", hook, fault)
    assert (meta["mode"], meta["n_dropped"]) == ("full", 0) and meta["bytes_written"] > 0
    return path


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    root = tmp_path_factory.mktemp("full")
    torch.set_num_threads(1)
    return {"python": _llama(root / "python", "python"), "cpp": _llama(root / "cpp", "cpp"),
            "cpp_bad": _llama(root / "cpp_bad", "cpp", fault=True)}


def _same_values(a, b) -> bool:
    la, sa = tree_flatten(a)
    lb, sb = tree_flatten(b)

    def same(x, y) -> bool:
        if isinstance(x, torch.Tensor):
            return (isinstance(y, torch.Tensor) and x.dtype == y.dtype and x.shape == y.shape
                    and torch.equal(x, y))
        if isinstance(x, Unsaved):  # a generator: its text names an address
            return isinstance(y, Unsaved)
        return type(x) is type(y) and (x == y or (x != x and y != y))

    return sa == sb and all(same(x, y) for x, y in zip(la, lb))


def _written_only(data: dict) -> dict:
    """The payload with the elements no op wrote since an empty* (their masks) set to 0: the
    allocator's leftovers differ between runs."""
    masks = data.get("unwritten", {})
    out = dict(data)
    for part, trees in (("inputs", ("args", "kwargs")), ("outputs", ("outputs",))):
        where = dict((k, m) for k, m in masks.get(part, []))
        if not where:
            continue
        leaves, spec = tree_flatten(tuple(data[t] for t in trees))
        k = 0
        for i, x in enumerate(leaves):
            if isinstance(x, torch.Tensor):
                if k in where:
                    leaves[i] = x.masked_fill(where[k], 0)
                k += 1
        for t, v in zip(trees, spec.unflatten(leaves)):
            out[t] = v
    return out


def _assert_same_records(pairs, a: Dump, b: Dump) -> None:
    for ra, rb in pairs:
        assert {k: v for k, v in ra.items() if k not in PLACE} == {k: v for k, v in rb.items() if k not in PLACE}
        assert (ra["file"] is None) == (rb["file"] is None)
        if ra["file"] is not None:
            assert _same_values(_written_only(a.load(ra)), _written_only(b.load(rb))), (ra["op"], ra["index"])


def test_a_cpp_hooked_full_capture_holds_the_records_and_tensors_of_a_python_hooked_one(llama):
    cpp, py = Dump.open(llama["cpp"]), Dump.open(llama["python"])
    assert cpp.meta["hook"] == "cpp" and py.meta["hook"] == "python"
    # Both hooks number the same ops (a full capture keeps each op's outputs, the gradients among them,
    # so autograd sums gradients out of place through either hook): every record pairs with the n-th of its
    # (kind, op, phase, module, step) on the other side.
    groups: dict = defaultdict(lambda: ([], []))
    for side, dump in enumerate((py, cpp)):
        for r in dump.records:
            groups[(r.get("kind", "op"), r["op"], r["overload"], r["phase"], r["module"], r["step"])][side].append(r)
    pairs = [p for a, b in groups.values() if len(a) == len(b) for p in zip(a, b)]
    assert len(pairs) == len(py.records) == len(cpp.records)
    assert {r.get("kind", "op") for r, _ in pairs} == {"op", "module"}
    assert {r["phase"] for r, _ in pairs} >= {"forward", "backward", "optimizer"}
    _assert_same_records(pairs, py, cpp)
    report = compare_dumps(llama["cpp"], llama["python"]).to_dict()
    assert report["n_failed"] == 0 and report["n_unmatched"] == 0 and report["n_passed"] > 0.9 * len(cpp.op_records)


def test_a_planted_fault_is_found_at_the_same_op_from_a_cpp_hooked_full_capture(llama):
    for reference in ("cpp", "python"):
        fd = compare_dumps(llama["cpp_bad"], llama[reference]).first_divergence
        assert (fd["op"], fd["module"], fd["phase"], fd["step"], fd["status"]) == (
            "aten::mm", FAULTY, "forward", 0, "fail")
    assert main(["compare", llama["cpp_bad"], llama["python"]]) == 1
    assert main(["compare", llama["cpp"], llama["python"]]) == 0


def _program(cap, hold: list) -> None:
    """Each kind of argument and return a payload holds, and writes to tensors records hold uncopied:
    in the same step (copied before the write) and after the step's records went to the writer
    (the write waits for their part)."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 6, generator=g)
    for _ in range(2):
        y = x.exp()                                  # held uncopied (compact)
        y.t()[1:3].sum(dim=[0], keepdim=True, dtype=torch.float64)  # a view's copy; keyword-only dtype
        y.add_(1.5)                                  # writes a held tensor: the earlier records keep its old values
        torch.max(y, 1)                              # two returns
        y.clone().addcmul_(x, y, value=0.5)          # an op that writes, its other inputs kept uncopied
        parts = torch.split(y, [1, 3])               # a list returned
        parts[1].mul_(2.0)                           # writes through a view of y
        torch._assert_async((y > -1e9).all())        # no return
        z = torch.empty_like(y, memory_format=torch.contiguous_format)
        z[:2].copy_(y[:2])                           # half written: unwritten elements in the payload
        (z[:2] * 3).to(torch.int32)
        torch.where(y > 3, y, 0.0).clamp(min=None, max=5.0)
        hold.append(y)
        cap.step()                                   # handed to the writer
        y.mul_(-1)                                   # after the hand-over: waits for the part
        x = x + 1


@pytest.mark.parametrize("max_queued_bytes", [native_hook.MAX_QUEUED_BYTES, 1])
def test_each_kind_of_argument_and_return_is_held_as_the_python_hook_holds_it(tmp_path, monkeypatch,
                                                                               max_queued_bytes):
    # a queue of 1 byte: each step's hand-over waits until the writer has written the one before
    monkeypatch.setattr(native_hook, "MAX_QUEUED_BYTES", max_queued_bytes)
    dumps = {}
    for hook in ("python", "cpp"):
        with torch.no_grad(), Capture(str(tmp_path / hook), mode="full", hook=hook) as cap:
            _program(cap, [])
        assert cap.hook_used == hook
        dumps[hook] = Dump.open(str(tmp_path / hook))
    py, cpp = dumps["python"], dumps["cpp"]
    assert [r["op"] for r in cpp.records] == [r["op"] for r in py.records]
    ops = {r["op"] for r in py.records}
    assert {"aten::add_", "aten::split_with_sizes", "aten::_assert_async", "aten::max", "aten::empty_like"} <= ops
    assert any(r.get("unwritten") for r in py.records)
    _assert_same_records(zip(py.records, cpp.records), py, cpp)


def test_a_part_file_that_cannot_be_written_is_an_error(tmp_path):
    path = tmp_path / "cap"
    os.makedirs(path / "tensors")
    os.symlink("/dev/full", path / "tensors" / "part00000.bin")  # the first part: no space left
    with pytest.raises(RuntimeError, match=r"part00000\.bin failed"):
        with torch.no_grad(), Capture(str(path), mode="full", hook="cpp") as cap:
            _program(cap, [])
    assert not os.path.exists(path / "meta.json")  # a capture that is not whole is not marked finished


def test_past_the_size_cap_ops_are_indexed_without_tensors_as_the_python_hook_does(tmp_path):
    dumps = {}
    for hook in ("python", "cpp"):
        with torch.no_grad(), Capture(str(tmp_path / hook), mode="full", hook=hook, max_bytes=1500) as cap:
            _program(cap, [])
        dumps[hook] = Dump.open(str(tmp_path / hook))
    py, cpp = dumps["python"], dumps["cpp"]
    kept = [r["file"] is not None for r in py.records]
    assert any(kept) and not all(kept)
    assert [r["file"] is not None for r in cpp.records] == kept
    for key in ("bytes_written", "n_dropped"):
        assert cpp.meta[key] == py.meta[key]
    _assert_same_records(zip(py.records, cpp.records), py, cpp)
