"""Cross-rank checks of every collective with an invariant (reduce-scatter, all-to-all, reduce,
gather, scatter) and of DDP's gradient all-reduce, issued by its C++ reducer through the
dispatcher's c10d ops, on a real 2-process gloo job (loopback only). References: the gradients of
each rank computed by plain torch without DDP, collective results computed by hand from the ranks'
captured inputs, and records altered so that an invariant is broken."""
import copy
import json

import pytest
import torch

from ditorch_precision.cli import main
from ditorch_precision.collectives import check_across_ranks, stats_from_capture
from ditorch_precision.dump import Dump

CHECKED = ["c10d::reduce_scatter_", "c10d::_reduce_scatter_base_", "c10d::alltoall_", "c10d::alltoall_base_",
           "c10d::reduce_", "c10d::gather_", "c10d::scatter_"]
DDP = ["c10d::allgather_", "c10d::broadcast_", "c10d::broadcast_", "c10d::allreduce_"]  # shapes, states, gradients


@pytest.fixture(scope="module")
def job(gloo_job):
    return gloo_job["collectives"]


def test_every_collective_passes_its_cross_rank_check(job):
    for rank in (0, 1):
        d = json.loads((job / f"autocompare_rank{rank}.json").read_text())
        assert d["failures"] == []
        rows = d["collectives"]
        assert [r["op"] for r in rows] == CHECKED + DDP
        assert all(r["status"] == "pass" for r in rows), [r for r in rows if r["status"] != "pass"]


def test_ddp_gradients_are_the_mean_and_its_all_reduce_is_captured(job):
    grads = [torch.load(job / f"ddp_rank{r}.pt") for r in (0, 1)]
    for r in (0, 1):  # plain torch: the mean of the ranks' own gradients
        for own0, own1, ddp in zip(grads[0]["own"], grads[1]["own"], grads[r]["ddp"]):
            torch.testing.assert_close(ddp, (own0 + own1) / 2, rtol=1e-6, atol=1e-7)
    captured = []
    for r in (0, 1):
        d = Dump.open(str(job / "capture" / f"rank{r}"))
        rec = [x for x in d.op_records if x["op"] == "c10d::allreduce_"]
        assert len(rec) == 1 and rec[0]["phase"] == "backward"  # the reducer's bucket, during backward
        captured.append(d.load(rec[0]))
    bucket = captured[0]["args"][0][0] + captured[1]["args"][0][0]  # by hand, from the inputs as they were
    for c in captured:
        torch.testing.assert_close(c["outputs"][0][0], bucket, rtol=1e-6, atol=1e-7)


def _per_rank(job) -> dict:
    out = {}
    for r in (0, 1):
        d = Dump.open(str(job / "capture" / f"rank{r}"))
        out[r] = [stats_from_capture(x, d.load(x), 2) for x in d.op_records if x["op"] in CHECKED]
    return out


def _broken(per_rank, op, rank, change):
    bad = copy.deepcopy(per_rank)
    change(next(c for c in bad[rank] if c["op"] == op))
    return next(r for r in check_across_ranks(bad) if r["op"] == op)


def test_the_checks_pass_on_the_captures_and_fail_when_an_invariant_breaks(job):
    per_rank = _per_rank(job)
    assert [r["status"] for r in check_across_ranks(per_rank)] == ["pass"] * len(CHECKED)
    cases = {
        "c10d::reduce_scatter_": (1, lambda c: c.update(out_sum=c["out_sum"] + 1.0)),
        "c10d::alltoall_": (1, lambda c: c["out_pieces"].reverse()),
        "c10d::alltoall_base_": (0, lambda c: c["out_pieces"].reverse()),
        "c10d::reduce_": (0, lambda c: c.update(out_sum=c["out_sum"] * 1.001)),
        "c10d::gather_": (0, lambda c: c["out_pieces"].reverse()),
        "c10d::scatter_": (1, lambda c: c.update(out_check=c["out_check"] + 0.5)),
    }
    for op, (rank, change) in cases.items():
        row = _broken(per_rank, op, rank, change)
        assert row["status"] == "fail", (op, row)


def test_cross_rank_compare_checks_every_collective_from_the_captures(job, capsys):
    assert main(["compare", str(job), str(job), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert [c["op"] for c in d["collectives"]] == CHECKED + DDP
    assert all(c["status"] == "pass" for c in d["collectives"])
