"""Point-to-point transfers (send/recv, one from any source, isend/irecv, batch_isend_irecv, one in
backward) under a stats capture on a real 2-process gloo job, through the Python hook and through
hook "auto", which under torch.distributed takes the C++ observer: both write the same index lines
and the same transfer records (transfers.jsonl: numbering, peer, tag, group, checksum). References:
the tensors each rank actually sent or received (taken after the capture), each hashed by
``point_to_point.checksum``, and the cross-rank compare, which matches each receive to its send."""
import json

import pytest
import torch

from ditorch_precision import native
from ditorch_precision.cli import main
from ditorch_precision.dump import Dump
from ditorch_precision.point_to_point import SEND, checksum, load_transfers

pytestmark = pytest.mark.skipif(not native.available(), reason=f"C++ module not built: {native.why_not()}")

RANKS = (0, 1)


@pytest.fixture(scope="module")
def job(tmp_path_factory, launch_gloo):
    root = tmp_path_factory.mktemp("transfers")
    launch_gloo("ditorch_precision.examples.dist_transfers", root, 2)
    return root


def _capture(job, hook: str, rank: int):
    return job / hook / "capture" / f"rank{rank}"


def test_auto_takes_the_cpp_hook_under_torch_distributed(job):
    for rank in RANKS:
        assert json.loads((_capture(job, "auto", rank) / "meta.json").read_text())["hook"] == "cpp"
        assert json.loads((_capture(job, "python", rank) / "meta.json").read_text())["hook"] == "python"


def test_both_hooks_write_the_same_index_lines(job):
    for rank in RANKS:
        python, cpp = (Dump.open(str(_capture(job, hook, rank))).op_records for hook in ("python", "auto"))
        assert [r["op"] for r in cpp] == [r["op"] for r in python]
        assert cpp == python


def test_both_hooks_write_the_same_transfer_records_of_the_bytes_moved(job):
    for rank in RANKS:
        python, cpp = (load_transfers(str(_capture(job, hook, rank))) for hook in ("python", "auto"))
        assert cpp == python
        moved = torch.load(job / f"tensors_rank{rank}.pt")
        assert [r["op"] == SEND for r in cpp] == [direction == "sent" for direction, _ in moved]
        assert [r["check"] for r in cpp] == [checksum([t]) for _, t in moved]
        assert {r["peer"] for r in cpp} == {1 - rank}
        assert all(r["group"] == [0, 1] for r in cpp)
        phases = [(r["op"], r["tag"], r["phase"], r["module"]) for r in cpp if r["tag"] in (7, 11)]
        grad = (SEND if rank else "c10d::recv_", 11, "backward" if rank else "forward", "Stage.lin" if rank else None)
        assert phases == [(SEND, 7, "forward", "Stage"), ("c10d::recv_", 7, "forward", "Stage"), grad]


def test_the_cross_rank_compare_matches_every_transfer_of_the_cpp_capture(job, capsys):
    assert main(["compare", str(job / "auto"), str(job / "python"), "--json"]) == 0
    rows = [c for c in json.loads(capsys.readouterr().out)["collectives"] if c["rule"] == "point_to_point"]
    assert sorted((r["src"], r["dst"], r["tag"], r["status"]) for r in rows) == sorted(
        [(0, 1, tag, "pass") for tag in (0, 2, 5, 6, 7, 8, 9)] + [(1, 0, tag, "pass") for tag in (2, 7, 11)])
