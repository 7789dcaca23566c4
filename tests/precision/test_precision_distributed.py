"""The tools under a real 2-process gloo job (loopback only): data-parallel training of a small
HuggingFace Llama with hand-written gradient all-reduces, captured and autocompared on every rank.
References: the collective's result computed by hand from both ranks' captured inputs, and a
fault planted on one rank only."""
import json

import pytest
import torch

from ditorch_precision.cli import main
from ditorch_precision.collectives import check_across_ranks
from ditorch_precision.dump import Dump

pytest.importorskip("transformers")

ROOT = "LlamaForCausalLM.model.layers"


@pytest.fixture(scope="module")
def jobs(gloo_job):
    return gloo_job  # one launch: "ref" (honest) and "fault" (a fault on rank 1)


def _collectives(run, rank):
    d = Dump.open(str(run / "capture" / f"rank{rank}"))
    return [(r, d.load(r)) for r in d.op_records if r["op"] == "c10d::allreduce_"]


def test_a_captured_all_reduce_holds_the_reduced_result(jobs):
    ranks = [_collectives(jobs["ref"], r) for r in (0, 1)]
    assert len(ranks[0]) == len(ranks[1]) == 21  # one per parameter
    for (r0, d0), (_, d1) in zip(*ranks):
        assert r0["reduce_op"] == "SUM"
        expected = d0["args"][0][0] + d1["args"][0][0]  # by hand, from the inputs as they were
        assert not torch.equal(d0["args"][0][0], d1["args"][0][0])  # the ranks had different data
        torch.testing.assert_close(d0["outputs"][0][0], expected, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(d1["outputs"][0][0], expected, rtol=1e-6, atol=1e-7)


def test_autocompare_checks_collectives_across_ranks_without_running_them_again(jobs):
    for rank in (0, 1):
        d = json.loads((jobs["ref"] / f"autocompare_rank{rank}.json").read_text())
        assert d["failures"] == []
        rows = d["collectives"]
        assert len(rows) == d["n_params"] + 1 == 22  # the gradients' c10d all-reduces, the loss's functional one
        assert all(r["status"] == "pass" and "SUM of the inputs" in r["detail"] for r in rows[:-1])
        assert rows[-1]["op"] == "_c10d_functional::all_reduce" and "AVG of the inputs" in rows[-1]["detail"]
    losses = [json.loads((jobs["ref"] / f"autocompare_rank{r}.json").read_text()) for r in (0, 1)]
    mean = (losses[0]["loss"] + losses[1]["loss"]) / 2  # by hand
    assert losses[0]["mean_loss"] == pytest.approx(mean, rel=1e-6) == losses[1]["mean_loss"]


def test_autocompare_on_the_faulty_rank_names_the_planted_op(jobs):
    bad = json.loads((jobs["fault"] / "autocompare_rank1.json").read_text())
    good = json.loads((jobs["fault"] / "autocompare_rank0.json").read_text())
    assert [(f["op"], f["module"]) for f in bad["failures"]] == [("aten::mm", f"{ROOT}.1.mlp.down_proj")]
    assert good["failures"] == []


def test_cross_rank_compare_gives_one_summary_naming_the_faulty_rank(jobs, capsys):
    assert main(["compare", str(jobs["ref"]), str(jobs["ref"])]) == 0
    assert "2 ranks: no divergence" in capsys.readouterr().out
    assert main(["compare", str(jobs["fault"]), str(jobs["ref"]), "--json"]) == 1
    d = json.loads(capsys.readouterr().out)
    fd = d["first_divergence"]
    assert (fd["rank"], fd["op"], fd["module"]) == (1, "aten::mm", f"{ROOT}.1.mlp.down_proj")
    assert d["per_rank"]["0"]["n_failed"] == 0 and d["per_rank"]["1"]["n_failed"] == 1
    assert len(d["collectives"]) == 22 and all(c["status"] == "pass" for c in d["collectives"])


def test_cross_rank_compare_rejects_different_rank_sets(jobs, tmp_path, capsys):
    import shutil

    shutil.copytree(jobs["ref"] / "capture" / "rank0", tmp_path / "capture" / "rank0")
    assert main(["compare", str(tmp_path), str(jobs["ref"])]) == 2
    assert "different ranks" in capsys.readouterr().err


def _call(rank_in, rank_out, op="c10d::allreduce_", reduce_op="SUM", check=None):
    return {"index": 5, "op": op, "in_sum": rank_in, "in_abs": abs(rank_in), "out_sum": rank_out,
            "out_abs": abs(rank_out), "out_check": rank_out * 1.5 if check is None else check, "reduce_op": reduce_op}


def test_cross_rank_invariants_catch_a_wrong_reduction_and_disagreeing_ranks():
    ok = check_across_ranks({0: [_call(1.0, 3.0)], 1: [_call(2.0, 3.0)]})
    assert [r["status"] for r in ok] == ["pass"]
    wrong_sum = check_across_ranks({0: [_call(1.0, 4.0)], 1: [_call(2.0, 4.0)]})
    assert wrong_sum[0]["status"] == "fail" and "SUM" in wrong_sum[0]["detail"]
    disagree = check_across_ranks({0: [_call(1.0, 3.0)], 1: [_call(2.0, 3.0, check=9.0)]})
    assert disagree[0]["status"] == "fail" and "differ across ranks" in disagree[0]["detail"]
    avg = check_across_ranks({0: [_call(1.0, 1.5, reduce_op="AVG")], 1: [_call(2.0, 1.5, reduce_op="AVG")]})
    assert avg[0]["status"] == "pass"
    uneven = check_across_ranks({0: [_call(1.0, 3.0), _call(1.0, 3.0)], 1: [_call(2.0, 3.0)]})
    assert uneven[0]["status"] == "fail" and "different numbers" in uneven[0]["detail"]


def test_a_subgroup_call_is_checked_among_its_members_with_its_group_ranks():
    """A 4-rank job; ranks 1 and 3 form a group (group ranks 0 and 1) and scatter from group rank 1,
    global rank 3: rank 1 must get the root's piece 0, rank 3 its piece 1. Ranks 0 and 2 ran nothing."""
    pieces = [(1.0, 1.0, 1.5), (2.0, 2.0, 3.5)]  # (sum, sum of |x|, checksum) of the root's two pieces

    def scatter(got: int) -> dict:
        return {"index": 3, "op": "c10d::scatter_", "group": [1, 3], "root": 1, "in_pieces": pieces,
                "in_sum": 3.0, "in_abs": 3.0, "in_check": 5.0, "out_sum": pieces[got][0], "out_abs": pieces[got][1],
                "out_check": pieces[got][2], "reduce_op": None}

    ok = check_across_ranks({0: [], 1: [scatter(0)], 2: [], 3: [scatter(1)]})
    assert [(r["status"], r["group"]) for r in ok] == [("pass", [1, 3])]
    swapped = check_across_ranks({0: [], 1: [scatter(1)], 2: [], 3: [scatter(0)]})
    assert [r["status"] for r in swapped] == ["fail"]


class _Page:
    """An HTML page parsed strictly (stdlib html.parser; no browser on this host): every element
    closed in order, its text, its links and its table rows."""

    VOID = {"meta", "br", "img", "input", "link", "hr"}

    def __init__(self, path):
        from html.parser import HTMLParser

        page = self
        self.text, self.links, self.rows, stack = [], [], [], []

        class P(HTMLParser):
            def handle_starttag(self, tag, attrs):
                if tag == "a":
                    page.links.append(dict(attrs)["href"])
                if tag == "tr":
                    page.rows.append([])
                if tag not in _Page.VOID:
                    stack.append(tag)

            def handle_endtag(self, tag):
                assert stack and stack.pop() == tag, f"{path}: </{tag}> closes another element"

            def handle_data(self, data):
                page.text.append(data)
                if stack and stack[-1] in ("td", "a") and page.rows:
                    page.rows[-1].append(data)

        parser = P()
        parser.feed(path.read_text())
        parser.close()
        assert stack == [], f"{path}: unclosed {stack}"
        self.body = "".join(self.text)


def test_a_multi_rank_compare_writes_csv_and_html_per_rank_and_a_summary(jobs, tmp_path, capsys):
    """Before: "--csv/--html take single captures" (exit 2). The references: the per-rank compares
    (JSON) the same run gives."""
    import csv

    html_out, csv_out = tmp_path / "report.html", tmp_path / "report.csv"
    assert main(["compare", str(jobs["fault"]), str(jobs["ref"]), "--html", str(html_out), "--csv", str(csv_out),
                 "--json"]) == 1
    d = json.loads(capsys.readouterr().out)
    summary = _Page(html_out)
    assert sorted(summary.links) == ["report.rank0.html", "report.rank1.html"]
    assert "First divergence (over all ranks): rank 1 aten::mm" in summary.body
    assert f"Collectives across ranks ({len(d['collectives'])})" in summary.body
    for rank in (0, 1):
        page = _Page(tmp_path / f"report.rank{rank}.html")
        per = d["per_rank"][str(rank)]
        assert f"{per['n_ops']} ops: {per['n_passed']} pass, {per['n_failed']} fail" in page.body
        assert ("First divergence" in page.body) == (rank == 1)
        rows = list(csv.DictReader(open(tmp_path / f"report.rank{rank}.csv")))
        assert len(rows) == per["n_ops"] and sum(r["status"] == "fail" for r in rows) == per["n_failed"]
    ranks = [r for r in csv.DictReader(open(csv_out)) if r["rank"] != "all"]
    assert [(r["rank"], r["n_failed"], r["first_op"], r["file"]) for r in ranks] == [
        ("0", "0", "", "report.rank0.csv"), ("1", "1", "aten::mm", "report.rank1.csv")]
