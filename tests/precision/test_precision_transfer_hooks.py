"""Point-to-point transfers (send/recv, one from any source, isend/irecv, batch_isend_irecv, one in
backward) and two collectives under a stats and a full capture on a real 2-process gloo job, through
the Python hook and through hook "auto", which under torch.distributed takes the C++ observer: both
write the same index lines, the same transfer records (transfers.jsonl: numbering, peer, tag, group,
checksum) and, in a full capture, the same saved arguments and outputs. References: the tensors each
rank actually sent or received (taken after the captures), each hashed by ``point_to_point.checksum``
or compared with what a full capture saved of a send, and the cross-rank compare, which matches each
receive to its send and checks each collective's result against the ranks' inputs."""
import json
import subprocess
import sys

import pytest
import torch

from ditorch_precision import native
from ditorch_precision.cli import main
from ditorch_precision.dump import Dump, Unsaved, tensors_in
from ditorch_precision.point_to_point import SEND, checksum, load_transfers

pytestmark = pytest.mark.skipif(not native.available(), reason=f"C++ module not built: {native.why_not()}")

RANKS = (0, 1)
MODES = ("stats", "full")


@pytest.fixture(scope="module")
def job(tmp_path_factory, launch_gloo):
    root = tmp_path_factory.mktemp("transfers")
    launch_gloo("ditorch_precision.examples.dist_transfers", root, 2)
    return root


def _capture(job, mode: str, hook: str, rank: int):
    return job / mode / hook / "capture" / f"rank{rank}"


@pytest.mark.parametrize("mode", MODES)
def test_auto_takes_the_cpp_hook_under_torch_distributed(job, mode):
    for rank in RANKS:
        assert json.loads((_capture(job, mode, "auto", rank) / "meta.json").read_text())["hook"] == "cpp"
        assert json.loads((_capture(job, mode, "python", rank) / "meta.json").read_text())["hook"] == "python"


@pytest.mark.parametrize("mode", MODES)
def test_both_hooks_write_the_same_index_lines(job, mode):
    for rank in RANKS:
        python, cpp = (Dump.open(str(_capture(job, mode, hook, rank))).op_records for hook in ("python", "auto"))
        assert [r["op"] for r in cpp] == [r["op"] for r in python]
        assert cpp == python


@pytest.mark.parametrize("mode", MODES)
def test_both_hooks_write_the_same_transfer_records_of_the_bytes_moved(job, mode):
    for rank in RANKS:
        python, cpp = (load_transfers(str(_capture(job, mode, hook, rank))) for hook in ("python", "auto"))
        assert cpp == python
        moved = torch.load(job / f"tensors_rank{rank}.pt")
        assert [r["op"] == SEND for r in cpp] == [direction == "sent" for direction, _ in moved]
        assert [r["check"] for r in cpp] == [checksum([t]) for _, t in moved]
        assert {r["peer"] for r in cpp} == {1 - rank}
        assert all(r["group"] == [0, 1] for r in cpp)
        phases = [(r["op"], r["tag"], r["phase"], r["module"]) for r in cpp if r["tag"] in (7, 11)]
        grad = (SEND if rank else "c10d::recv_", 11, "backward" if rank else "forward", "Stage.lin" if rank else None)
        assert phases == [(SEND, 7, "forward", "Stage"), ("c10d::recv_", 7, "forward", "Stage"), grad]


def _structure(x):
    """``x`` with each tensor as its dtype and shape, and each unsaved object (its text names an
    address) as one marker."""
    if isinstance(x, torch.Tensor):
        return ("tensor", x.dtype, tuple(x.shape))
    if isinstance(x, Unsaved) or (isinstance(x, dict) and x.get("__precision__") == "unsaved"):
        return "unsaved"
    if isinstance(x, (list, tuple)):
        return type(x).__name__, [_structure(v) for v in x]
    if isinstance(x, dict):
        return {k: _structure(v) for k, v in x.items()}
    return x


def _written(data: dict, side: str) -> list[torch.Tensor]:
    """The tensors of a saved op's inputs or outputs, elements no op had written (after an empty*) as 0."""
    tensors = tensors_in((data["args"], data["kwargs"]) if side == "inputs" else data["outputs"])
    masks = dict((k, m) for k, m in data.get("unwritten", {}).get(side, []))
    return [t.masked_fill(masks[k], 0) if k in masks else t for k, t in enumerate(tensors)]


def test_both_hooks_save_the_same_arguments_and_outputs_in_a_full_capture(job):
    for rank in RANKS:
        python, cpp = (Dump.open(str(_capture(job, "full", hook, rank))) for hook in ("python", "auto"))
        assert [r["op"] for r in cpp.op_records] == [r["op"] for r in python.op_records]
        for a, b in zip(python.op_records, cpp.op_records):
            da, db = python.load(a), cpp.load(b)
            assert _structure(db) == _structure(da), a["op"]
            for side in ("inputs", "outputs"):
                for x, y in zip(_written(da, side), _written(db, side)):
                    torch.testing.assert_close(y, x, rtol=0, atol=0, equal_nan=True, msg=f"{a['op']} {side}")


def test_a_full_capture_saves_what_each_send_sent(job):
    for rank in RANKS:
        cpp = Dump.open(str(_capture(job, "full", "auto", rank)))
        saved = [cpp.load(r)["outputs"][0] for r in cpp.op_records if r["op"] == SEND]
        sent = [t for direction, t in torch.load(job / f"tensors_rank{rank}.pt") if direction == "sent"]
        assert len(saved) == len(sent)
        for (got,), want in zip(saved, sent):
            torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("mode", MODES)
def test_the_cross_rank_compare_checks_every_transfer_of_the_cpp_capture(job, mode, capsys):
    assert main(["compare", str(job / mode / "auto"), str(job / mode / "python"), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["collectives"]
    transfers = [r for r in rows if r["rule"] == "point_to_point"]
    assert sorted((r["src"], r["dst"], r["tag"], r["status"]) for r in transfers) == sorted(
        [(0, 1, tag, "pass") for tag in (0, 2, 5, 6, 7, 8, 9)] + [(1, 0, tag, "pass") for tag in (2, 7, 11)])
    # a full capture's collectives are checked from the tensors it saved (a stats capture saves none)
    collectives = [(r["op"], r["status"]) for r in rows if r["rule"] != "point_to_point"]
    assert collectives == ([("c10d::allreduce_", "pass"), ("c10d::reduce_", "pass")] if mode == "full" else [])


def test_the_example_refuses_a_world_other_than_two(tmp_path):
    done = subprocess.run([sys.executable, "-m", "ditorch_precision.examples.dist_transfers", str(tmp_path), "3", "0"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "world 3" in done.stderr and "expected 2" in done.stderr, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
