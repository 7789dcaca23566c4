"""Cross-rank checks of every collective with an invariant (reduce-scatter, all-to-all, reduce,
gather, scatter) and of DDP's gradient all-reduce, issued by its C++ reducer through the
dispatcher's c10d ops, on a real 2-process gloo job (loopback only). References: the gradients of
each rank computed by plain torch without DDP, collective results computed by hand from the ranks'
captured inputs, and records altered so that an invariant is broken."""
import copy
import json
import math

import pytest
import torch
from torch.utils._pytree import tree_leaves

from ditorch_precision.cli import main
from ditorch_precision.collectives import POINT_TO_POINT, check_across_ranks, stats_from_capture
from ditorch_precision.dump import Dump
from ditorch_precision.examples.dist_collectives import LARGE as LARGE_ELEMENTS

CHECKED = ["c10d::reduce_scatter_", "c10d::_reduce_scatter_base_", "c10d::alltoall_", "c10d::alltoall_base_",
           "c10d::reduce_", "c10d::gather_", "c10d::scatter_"]
REDUCTIONS = ["c10d::allreduce_"] * 5  # MAX, MIN, PRODUCT, an integer MAX, an integer SUM
# MAX reduce, MIN and PRODUCT reduce-scatters, an integer PRODUCT reduce and all-reduce (wrapping around).
ONE_HOLDER = ["c10d::reduce_", "c10d::reduce_scatter_", "c10d::_reduce_scatter_base_", "c10d::reduce_",
              "c10d::allreduce_"]
# MAX all-reduce, MAX reduce, MIN reduce-scatter of tens of thousands of elements, tied across ranks.
LARGE = ["c10d::allreduce_", "c10d::reduce_", "c10d::_reduce_scatter_base_"]
DDP = ["c10d::allgather_", "c10d::broadcast_", "c10d::broadcast_", "c10d::allreduce_"]  # shapes, states, gradients
# The default group's calls, then those of the group whose only member is rank 1.
ROWS = (CHECKED + REDUCTIONS + ONE_HOLDER + ["c10d::allreduce_"] + LARGE + DDP
        + ["c10d::allreduce_", "c10d::scatter_"])


@pytest.fixture(scope="module")
def job(gloo_job):
    return gloo_job["collectives"]


def test_every_collective_passes_its_cross_rank_check(job):
    for rank in (0, 1):
        d = json.loads((job / f"autocompare_rank{rank}.json").read_text())
        assert d["failures"] == []
        rows = d["collectives"]
        assert [r["op"] for r in rows] == ROWS
        assert all(r["status"] == "pass" for r in rows), [r for r in rows if r["status"] != "pass"]
        ops = [r["detail"] for r in rows[len(CHECKED):len(CHECKED) + 5]]
        assert ["MAX" in ops[0], "MIN" in ops[1], "PRODUCT" in ops[2], "MAX" in ops[3], "SUM" in ops[4]] == [True] * 5
        assert [r["group"] for r in rows[-2:]] == [[1], [1]]  # subgroup ranks as global ranks
        held = [r["detail"] for r in rows[len(CHECKED) + 5:len(CHECKED) + 10]]
        assert all("elementwise" in d for d in held), held
        assert ["MAX" in held[0], "MIN" in held[1], "PRODUCT" in held[2], "exact" in held[3], "exact" in held[4]] \
            == [True] * 5


def test_point_to_point_transfers_are_matched_across_ranks(job):
    """send/recv (one from any source), isend/irecv and batch_isend_irecv: each transfer's bytes as
    sent and as received."""
    for rank in (0, 1):
        rows = json.loads((job / f"autocompare_rank{rank}.json").read_text())["point_to_point"]
        got = sorted((r["src"], r["dst"], r["tag"], r["seq"], r["status"]) for r in rows)
        assert got == [(0, 1, 0, 0, "pass"), (0, 1, 2, 0, "pass"), (0, 1, 3, 0, "pass"), (0, 1, 5, 0, "pass"),
                       (0, 1, 6, 0, "pass"), (1, 0, 2, 0, "pass"), (1, 0, 3, 0, "pass")], rows


def test_a_transfer_corrupted_on_one_side_fails_naming_both_ranks(job):
    for rank in (0, 1):
        rows = json.loads((job / f"autocompare_rank{rank}.json").read_text())["corrupted"]
        bad = [r for r in rows if r["status"] == "fail"]
        assert [(r["src"], r["dst"], r["tag"], r["seq"]) for r in bad] == [(0, 1, 0, 0)], rows
        assert "rank 0" in bad[0]["detail"] and "rank 1" in bad[0]["detail"]
        assert sum(r["status"] == "pass" for r in rows) == 6


def test_ddp_gradients_are_the_mean_and_its_all_reduce_is_captured(job):
    grads = [torch.load(job / f"ddp_rank{r}.pt") for r in (0, 1)]
    for r in (0, 1):  # plain torch: the mean of the ranks' own gradients
        for own0, own1, ddp in zip(grads[0]["own"], grads[1]["own"], grads[r]["ddp"]):
            torch.testing.assert_close(ddp, (own0 + own1) / 2, rtol=1e-6, atol=1e-7)
    captured = []
    for r in (0, 1):
        d = Dump.open(str(job / "capture" / f"rank{r}"))
        rec = [x for x in d.op_records if x["op"] == "c10d::allreduce_" and x["phase"] == "backward"]
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
    statuses = [r["status"] for r in check_across_ranks(per_rank)]
    assert statuses == ["pass"] * (len(CHECKED) + 7)  # scatter_ twice, 4 of ONE_HOLDER, 2 of LARGE
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
    assert [c["op"] for c in d["collectives"] if c["rule"] != "point_to_point"] == ROWS
    transfers = [(c["src"], c["dst"], c["tag"]) for c in d["collectives"] if c["rule"] == "point_to_point"]
    assert sorted(transfers) == [(0, 1, 0), (0, 1, 2), (0, 1, 3), (0, 1, 5), (0, 1, 6), (1, 0, 2), (1, 0, 3)]
    assert all(c["status"] == "pass" for c in d["collectives"])


def test_cross_rank_compare_of_captures_names_both_ranks_of_a_corrupted_transfer(job, capsys):
    assert main(["compare", str(job / "corrupted"), str(job / "corrupted"), "--json"]) == 1
    d = json.loads(capsys.readouterr().out)
    bad = [c for c in d["collectives"] if c["status"] == "fail"]
    assert [(c["src"], c["dst"], c["tag"], c["seq"]) for c in bad] == [(0, 1, 0, 0)]
    assert d["first_divergence"]["detail"] == bad[0]["detail"] and "rank 0" in bad[0]["detail"]


def _reductions(job, rank: int) -> list[tuple[dict, dict]]:
    """The MAX, MIN and PRODUCT all-reduces of one rank's capture: (record, saved tensors)."""
    d = Dump.open(str(job / "capture" / f"rank{rank}"))
    return [(x, d.load(x)) for x in d.op_records
            if x["op"] == "c10d::allreduce_" and x.get("reduce_op") in ("MAX", "MIN", "PRODUCT")
            and not (x["reduce_op"] == "PRODUCT" and x["inputs"][0]["dtype"] == "int64")
            and math.prod(x["inputs"][0]["shape"]) < LARGE_ELEMENTS]


def _reduction_records(job, change=None) -> dict:
    """Their cross-rank records; ``change(op, result)`` alters the result the same way on every rank (as
    a wrong all-reduce would) before they are made."""
    out = {}
    for r in (0, 1):
        out[r] = []
        for rec, data in _reductions(job, r):
            if change is not None:
                change(rec["reduce_op"], data["outputs"][0][0])
            out[r].append(stats_from_capture(rec, data, 2))
    return out


def test_max_min_and_product_all_reduces_are_checked_elementwise(job):
    mine, other = _reductions(job, 0), _reductions(job, 1)
    for (rec, a), (_, b) in zip(mine, other):  # plain torch on the captured inputs: the results are right
        x, y = a["args"][0][0], b["args"][0][0]
        assert not torch.equal(x, y)
        want = {"MAX": torch.maximum, "MIN": torch.minimum, "PRODUCT": torch.mul}[rec["reduce_op"]](x, y)
        torch.testing.assert_close(a["outputs"][0][0], want)
        torch.testing.assert_close(b["outputs"][0][0], want)
    assert [r["status"] for r in check_across_ranks(_reduction_records(job))] == ["pass"] * 4

    def at(i, f):  # the float all-reduces' results
        return lambda op, result: result.__setitem__(i, f(op, result[i])) if result.is_floating_point() else None

    wrong = {  # what a wrong all-reduce could leave, and the invariant that must catch it
        "an element above every input": at(0, lambda op, v: v + 1 if op == "MAX" else v),
        "an input above the result": at(1, lambda op, v: v - 100 if op == "MAX" else v),
        "an element below every input": at(2, lambda op, v: v - 1 if op == "MIN" else v),
        "a product off by 1e-3": at(3, lambda op, v: v * 1.001 if op == "PRODUCT" else v),
        "a product of the wrong sign": at(0, lambda op, v: -v if op == "PRODUCT" else v),
        "a zero product of non-zero inputs": at(1, lambda op, v: v * 0 if op == "PRODUCT" else v),
    }
    wrong["an integer maximum raised"] = lambda op, result: (None if result.is_floating_point()
                                                              else result.__setitem__(2, result[2] + 1))
    for what, change in wrong.items():
        rows = check_across_ranks(_reduction_records(job, change))
        assert [r["status"] for r in rows].count("fail") == 1, (what, rows)


def test_a_wrong_max_element_hidden_by_a_tie_is_found():
    """By hand: inputs [1, 5, 3] and [1, 2, 4], so MAX is [1, 5, 4]; a result [1, 5, 9] is reached by
    no input at element 2, while the count of equal elements (2 + 1) still covers 3 elements."""
    from ditorch_precision.reductions import check, local_stats

    a, b = torch.tensor([1.0, 5.0, 3.0]), torch.tensor([1.0, 2.0, 4.0])
    right, wrong = torch.maximum(a, b), torch.tensor([1.0, 5.0, 9.0])
    assert check("MAX", [local_stats("MAX", [a], [right]), local_stats("MAX", [b], [right])], [0, 1])[0] == "pass"
    calls = [local_stats("MAX", [a], [wrong]), local_stats("MAX", [b], [wrong])]
    assert sum(c["n_equal"] for c in calls) >= 3  # the count alone is fooled
    status, detail = check("MAX", calls, [0, 1])
    assert status == "fail" and "element 2" in detail


def test_an_integer_sum_all_reduce_is_checked(job):
    """By hand: ranks 0 and 1 reduce [1, 7] and [2, 7]: [3, 14]. A wrong result fails."""
    per_rank = {}
    for r in (0, 1):
        d = Dump.open(str(job / "capture" / f"rank{r}"))
        rec = next(x for x in d.op_records if x["op"] == "c10d::allreduce_" and x["reduce_op"] == "SUM"
                   and x["inputs"][0]["dtype"] == "int64")
        data = d.load(rec)
        assert data["outputs"][0][0].tolist() == [3, 14]
        per_rank[r] = data, rec
    assert [c["status"] for c in check_across_ranks({r: [stats_from_capture(rec, data, 2)]
                                                     for r, (data, rec) in per_rank.items()})] == ["pass"]
    for data, _ in per_rank.values():
        data["outputs"][0][0][1] += 1
    rows = check_across_ranks({r: [stats_from_capture(rec, data, 2)] for r, (data, rec) in per_rank.items()})
    assert [c["status"] for c in rows] == ["fail"] and "SUM" in rows[0]["detail"]


def _held(job) -> dict[int, list[tuple[dict, dict]]]:
    """Per rank, the ONE_HOLDER calls of its capture: (record, saved tensors)."""
    out = {}
    for r in (0, 1):
        d = Dump.open(str(job / "capture" / f"rank{r}"))
        recs = [x for x in d.op_records if x["op"].startswith("c10d::") and x["op"] not in POINT_TO_POINT]
        out[r] = [(x, d.load(x)) for x in recs[len(CHECKED) + 5:len(CHECKED) + 10]]
        assert [x["op"] for x, _ in out[r]] == ONE_HOLDER
    return out


def _result(data: dict) -> torch.Tensor:
    """The tensor a c10d call wrote (its first output)."""
    return next(t for t in tree_leaves(data["outputs"][0]) if isinstance(t, torch.Tensor))


def test_reduce_and_reduce_scatter_are_checked_elementwise(job):
    """Plain torch on the captured inputs gives each result (the integer product wrapped in int64); the
    checks pass on them, and fail on the call whose result on its holder is altered."""
    held = _held(job)
    (_, mx0), (_, mx1) = held[0][0], held[1][0]
    torch.testing.assert_close(_result(mx1), torch.maximum(mx0["args"][0][0], mx1["args"][0][0]))  # root 1
    for r in (0, 1):
        mn, pr = held[r][1][1], held[r][2][1]
        torch.testing.assert_close(_result(mn), torch.minimum(held[0][1][1]["args"][1][0][r],
                                                                held[1][1][1]["args"][1][0][r]))
        x, y = (held[q][2][1]["args"][1].chunk(2)[r] for q in (0, 1))
        torch.testing.assert_close(_result(pr), x * y)
    a, b = held[0][3][1]["args"][0][0], held[1][3][1]["args"][0][0]
    assert torch.equal(_result(held[0][3][1]), a * b) and torch.equal(_result(held[0][4][1]), a * b)
    assert int((a * b)[2]) == (3 ** 60 + 2 ** 63) % 2 ** 64 - 2 ** 63  # by hand: wrapped around in int64

    def rows(held):
        return check_across_ranks({r: [stats_from_capture(x, data, 2) for x, data in held[r]] for r in (0, 1)})

    assert [r["status"] for r in rows(held)] == ["pass"] * 5
    wrong = {  # (call, holder rank, change of its result)
        "a MAX above every input at the root": (0, 1, lambda t: t.__setitem__(2, t[2] + 1)),
        "a MIN below every input on rank 1": (1, 1, lambda t: t.__setitem__(0, t[0] - 1)),
        "a PRODUCT off by 1e-3 on rank 0": (2, 0, lambda t: t.__setitem__(1, t[1] * 1.001)),
        "an integer PRODUCT not wrapped at the root": (3, 0, lambda t: t.__setitem__(2, 7)),
        "an integer PRODUCT all-reduce off by one": (4, None, lambda t: t.__setitem__(0, t[0] + 1)),
    }
    for what, (call, holder, change) in wrong.items():
        held = _held(job)
        for r in (0, 1) if holder is None else (holder,):
            change(_result(held[r][call][1]))
        got = rows(held)
        assert [r["status"] for r in got] == ["pass"] * call + ["fail"] + ["pass"] * (4 - call), (what, got)


def _large(job) -> dict[int, list[tuple[dict, dict]]]:
    """Per rank, the LARGE calls of its capture: (record, saved tensors)."""
    out = {}
    start = len(CHECKED) + 5 + len(ONE_HOLDER) + 1
    for r in (0, 1):
        d = Dump.open(str(job / "capture" / f"rank{r}"))
        recs = [x for x in d.op_records if x["op"].startswith("c10d::") and x["op"] not in POINT_TO_POINT
                and x.get("group") == [0, 1]]  # rank 1's subgroup calls come before them
        out[r] = [(x, d.load(x)) for x in recs[start:start + len(LARGE)]]
        assert [x["op"] for x, _ in out[r]] == LARGE
    return out


def test_large_elementwise_reductions_are_checked_at_every_element(job):
    """Tens of thousands of elements, tied across ranks except at every 1000th: plain torch on the
    captured inputs gives each result; the live checks and those of the captures pass, and one wrong
    element planted in a result fails, named, although the ranks' counts of equal elements still
    cover every element."""
    for rank in (0, 1):
        rows = json.loads((job / f"autocompare_rank{rank}.json").read_text())["collectives"]
        start = len(CHECKED) + 5 + len(ONE_HOLDER) + 1
        live = rows[start:start + len(LARGE)]
        assert [r["op"] for r in live] == LARGE
        assert all(r["status"] == "pass" and "elementwise" in r["detail"] for r in live), live
    held = _large(job)
    ins = [[data["args"][0][0] if i < 2 else data["args"][1] for i, (_, data) in enumerate(held[r])] for r in (0, 1)]
    assert not torch.equal(ins[0][0], ins[1][0]) and int((ins[0][0] == ins[1][0]).sum()) > LARGE_ELEMENTS * 0.99
    torch.testing.assert_close(_result(held[0][0][1]), torch.maximum(ins[0][0], ins[1][0]), rtol=0, atol=0)
    torch.testing.assert_close(_result(held[1][1][1]), torch.maximum(ins[0][1], ins[1][1]), rtol=0, atol=0)  # root 1
    for r in (0, 1):
        want = torch.minimum(ins[0][2], ins[1][2]).chunk(2)[r]
        torch.testing.assert_close(_result(held[r][2][1]), want, rtol=0, atol=0)

    def rows(held):
        return check_across_ranks({r: [stats_from_capture(x, data, 2) for x, data in held[r]] for r in (0, 1)})

    assert [r["status"] for r in rows(held)] == ["pass"] * 3
    wrong = {  # (call, holder ranks, element, change): a value no rank's input has, on the right side of all
        "a MAX all-reduce element above both inputs": (0, (0, 1), 70_000 - 3, lambda v: v + 0.5),
        "a MAX reduce element above both inputs at the root": (1, (1,), 20_001, lambda v: v + 0.5),
        "a MIN reduce-scatter element below both inputs on rank 0": (2, (0,), 17_000, lambda v: v - 0.5),
    }
    for what, (call, holders, i, change) in wrong.items():
        held = _large(job)
        for r in holders:
            result = _result(held[r][call][1])
            result[i] = change(result[i])
        got = rows(held)
        assert [r["status"] for r in got] == ["pass"] * call + ["fail"] + ["pass"] * (2 - call), (what, got)
        assert f"element {i}" in got[call]["detail"], (what, got[call])
        if call == 0:  # the count of equal elements alone is fooled: the ranks tie elsewhere
            counts = [stats_from_capture(held[r][0][0], held[r][0][1], 2)["n_equal"] for r in (0, 1)]
            assert sum(counts) >= LARGE_ELEMENTS


def test_values_of_any_size_and_mixed_dtypes_are_checked_tensor_by_tensor():
    """By hand: two ranks' MAX of a float32 tensor of 100,000 elements and an int64 one whose values
    float64 cannot tell apart (2**62 and 2**62 + 1); a wrong element in either fails, named."""
    from ditorch_precision.reductions import check_values, encode

    a = [(torch.arange(100_000) % 13).float(), torch.tensor([2 ** 62, 5])]
    b = [(torch.arange(100_000) % 11).float(), torch.tensor([2 ** 62 + 1, 3])]
    right = [torch.maximum(a[0], b[0]), torch.tensor([2 ** 62 + 1, 5])]
    assert check_values("MAX", [encode(a), encode(b)], encode(right), [0, 1])[0] == "pass"
    for part, i, value in ((0, 99_999, 20.0), (1, 0, 2 ** 62 + 2)):
        wrong = [t.clone() for t in right]
        wrong[part][i] = value
        status, detail = check_values("MAX", [encode(a), encode(b)], encode(wrong), [0, 1])
        assert status == "fail" and detail.startswith(f"tensor {part}:") and f"element {i}" in detail, detail
