"""A subgroup in a real 3-process gloo job (loopback only; conftest's gloo_job starts it): the group
of global ranks 1 and 2, whose calls name group ranks (pieces, roots, peers 0 and 1). Its all-reduce,
reduce-scatter, MAX reduce to global rank 2 and send from global rank 1 to 2 are checked as calls of
global ranks 1 and 2; a transfer corrupted on arrival, and results altered in the captures, fail
naming the right global ranks. References: results computed by hand from the ranks' inputs
(x_r = [0, 1, 2, 3] + 10 r)."""
import json

import pytest
import torch
from torch.utils._pytree import tree_leaves

from ditorch_precision.collectives import POINT_TO_POINT, check_across_ranks, stats_from_capture
from ditorch_precision.dump import Dump

PAIR = ["c10d::allreduce_", "c10d::_reduce_scatter_base_", "c10d::reduce_"]


@pytest.fixture(scope="module")
def job(gloo_job):
    return gloo_job["subgroup"]


def _x(rank: int) -> torch.Tensor:
    return torch.arange(4, dtype=torch.float32) + 10 * rank


def test_the_pairs_calls_are_checked_as_calls_of_global_ranks_1_and_2(job):
    for rank in (0, 1, 2):
        d = json.loads((job / f"autocompare_rank{rank}.json").read_text())
        assert [(r["rule"], r["src"], r["dst"], r["tag"]) for r in d["failures"]] == [("point_to_point", 1, 2, 1)]
        rows = d["collectives"]
        want = [("c10d::allreduce_", [0, 1, 2])] + [(op, [1, 2]) for op in PAIR]
        assert [(r["op"], r["group"]) for r in rows] == want
        assert all(r["status"] == "pass" for r in rows), rows
        transfers = sorted((r["src"], r["dst"], r["tag"], r["status"]) for r in d["point_to_point"])
        assert transfers == [(1, 2, 0, "pass"), (1, 2, 1, "fail")], d["point_to_point"]
        bad = next(r for r in d["point_to_point"] if r["status"] == "fail")
        assert "from rank 1 to rank 2" in bad["detail"]
        assert "rank 2 received other bytes than rank 1 sent" in bad["detail"]


def _captured(job) -> dict[int, list[tuple[dict, dict]]]:
    """Per member of the pair, its calls of the pair's group: (record, saved tensors)."""
    out = {}
    for r in (1, 2):
        d = Dump.open(str(job / "capture" / f"rank{r}"))
        recs = [x for x in d.op_records if x["op"].startswith("c10d::") and x["op"] not in POINT_TO_POINT
                and x.get("group") == [1, 2]]
        assert [x["op"] for x in recs] == PAIR
        out[r] = [(x, d.load(x)) for x in recs]
    return out


def _result(data: dict) -> torch.Tensor:
    return next(t for t in tree_leaves(data["outputs"][0]) if isinstance(t, torch.Tensor))


def test_altered_results_fail_naming_the_global_ranks(job):
    held = _captured(job)
    total = _x(1) + _x(2)  # by hand
    for r, piece in ((1, 0), (2, 1)):
        assert torch.equal(_result(held[r][0][1]), total)
        assert torch.equal(_result(held[r][1][1]), total[2 * piece:2 * piece + 2])  # group rank = piece
    assert torch.equal(_result(held[2][2][1]), torch.maximum(_x(1), _x(2)))  # the root, global rank 2

    def rows(held):
        return check_across_ranks({r: [stats_from_capture(x, data, 2) for x, data in held[r]] for r in (1, 2)})

    assert [(r["status"], r["group"]) for r in rows(held)] == [("pass", [1, 2])] * 3
    wrong = {  # (call, rank whose result is altered, what the detail must say)
        "rank 2's reduce-scatter piece": (1, 2, "rank 2's piece"),
        "rank 1's reduce-scatter piece": (1, 1, "rank 1's piece"),
        "the reduce's result at global rank 2": (2, 2, "the result at the root, rank 2"),
    }
    for what, (call, rank, named) in wrong.items():
        held = _captured(job)
        result = _result(held[rank][call][1])
        result[0] += 1
        got = rows(held)
        assert [r["status"] for r in got] == ["pass"] * call + ["fail"] + ["pass"] * (2 - call), (what, got)
        assert got[call]["detail"].startswith(named), (what, got[call])
