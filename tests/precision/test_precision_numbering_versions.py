"""A capture made before both op hooks numbered the same ops (format version 6 and older: the Python
hook numbered the detach torch asks a dispatch mode for when autograd saves a result, the C++ hook
the per-tensor ops of a _foreach_* slow path and the inner ops of custom ops and factories, and not
silu_backward) holds other op sequences than one made now, through either hook. A compare of the
two must say so before anything else, as it does for captures made through different hooks: the
ops only one numbering holds are unmatched (aligned by structure) or misaligned (by call index).

The earlier capture is this version's own capture rewritten as the previous version wrote it: the
meta.json "version" 6, and a detach record after each forward op whose result autograd saves
(tanh, exp), the later ones renumbered. Two captures of this version through different hooks number
the same ops: their compare's note says so, not that the numbers differ. Runs on the CPU."""
import json
import os
import shutil

import pytest
import torch

from ditorch_precision import Capture, native
from ditorch_precision.diff import CompareOptions, compare_dumps
from ditorch_precision.dump import Dump

pytestmark = pytest.mark.usefixtures("one_thread")


def _program() -> None:
    torch.manual_seed(0)
    x = torch.randn(4, 4, requires_grad=True)
    torch.tanh(x).exp().sum().backward()


def _capture(path, hook: str) -> str:
    with Capture(str(path), mode="stats", hook=hook):
        _program()
    return str(path)


def _as_version_6(src: str, dst) -> str:
    """The capture as the previous version's Python hook wrote it: version 6, a detach numbered after
    tanh and after exp (autograd saves both results; a dispatch mode is asked for their detach)."""
    shutil.copytree(src, dst)
    with open(os.path.join(dst, "meta.json")) as f:
        meta = json.load(f)
    meta["version"] = 6
    with open(os.path.join(dst, "meta.json"), "w") as f:
        json.dump(meta, f)
    out, shift = [], 0
    with open(os.path.join(dst, "index.jsonl")) as f:
        for line in f:
            rec = json.loads(line)
            rec["index"] += shift
            out.append(rec)
            if rec.get("op") in ("aten::tanh", "aten::exp") and rec.get("phase") == "forward":
                shift += 1
                out.append({**rec, "index": rec["index"] + 1, "op": "aten::detach", "overload": "default",
                            "inputs": rec.get("outputs"), "file": None})
    with open(os.path.join(dst, "index.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in out)
    return str(dst)


@pytest.mark.parametrize("align", ["structure", "index"])
def test_a_capture_numbered_by_the_previous_rule_is_named_in_a_compare(tmp_path, align):
    new = _capture(tmp_path / "new", "python")
    old = _as_version_6(new, tmp_path / "old")
    report = compare_dumps(new, old, options=CompareOptions(align=align))
    numbering = [n for n in report.notes if "version" in n]
    assert len(numbering) == 1, report.notes
    (note,) = numbering
    assert f"A: {Dump.open(new).meta['version']}" in note and "B: 6" in note
    assert ("misaligned" if align == "index" else "unmatched") in note
    # the same numbering on both sides: no note
    assert compare_dumps(new, _capture(tmp_path / "again", "python"), options=CompareOptions(align=align)).notes == []


def test_an_earlier_capture_through_the_other_hook_is_named_by_both_notes(tmp_path):
    # version 6 through the C++ hook against this version's Python one: the hook note must not claim
    # that both number the same ops (that holds only since NUMBERED_ALIKE_SINCE)
    new = _capture(tmp_path / "new", "python")
    old = _as_version_6(new, tmp_path / "old")
    with open(os.path.join(old, "meta.json")) as f:
        meta = json.load(f)
    with open(os.path.join(old, "meta.json"), "w") as f:
        json.dump({**meta, "hook": "cpp"}, f)
    numbering, hooks = compare_dumps(new, old, options=CompareOptions(align="index")).notes
    assert "B: 6" in numbering
    assert "'python'" in hooks and "'cpp'" in hooks and "misaligned" in hooks
    assert "number the same ops" not in hooks


@pytest.mark.skipif(not native.available(), reason=f"C++ module not built: {native.why_not()}")
def test_a_compare_across_hooks_of_this_version_does_not_claim_the_numbers_differ(tmp_path):
    # both hooks number the same ops now: aligned by index every op pairs (nothing failed, nothing
    # unmatched), and the note names only what still differs (an op run out of place under a mode)
    py, cpp = _capture(tmp_path / "python", "python"), _capture(tmp_path / "cpp", "cpp")
    report = compare_dumps(cpp, py, options=CompareOptions(align="index"))
    d = report.to_dict()
    assert d["n_failed"] == 0 and d["n_passed"] == len(Dump.open(py).op_records)
    (note,) = report.notes
    assert "'cpp'" in note and "'python'" in note
    assert "misaligned" not in note and "call indices differ" not in note
    assert "out of place" in note
