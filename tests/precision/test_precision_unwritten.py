"""Uninitialised memory is never judged: what an ``empty*`` allocated and no op wrote since is saved
as 0 by a capture, through any view, so no rule compares the allocator's leftovers. A real 2-rank
gloo job under torch's DistributedDataParallel (its gradient buckets are ``aten::empty`` viewed with
``as_strided``), a fault on rank 1 only: rank 0 has no failures and the first divergence is rank 1's.
References: the planted fault's place, and torch itself (what the program wrote)."""
import json
import math

import pytest
import torch

from ditorch_precision import Capture, compare_dumps
from ditorch_precision.cli import main
from ditorch_precision.diff import compare_ranks
from ditorch_precision.dump import Dump

pytestmark = pytest.mark.usefixtures("one_thread")
DDP = "DistributedDataParallel"


def _track_from_start(path, fill):
    src = torch.arange(6, dtype=torch.float32)
    with Capture(str(path)):
        bucket = torch.empty(12)
        with torch.no_grad(), Capture.quiet():
            bucket.fill_(fill)  # the allocator's leftovers: no op of the program
        bucket.as_strided((4,), (1,), 6).mul(2.0)
        bucket.as_strided((6,), (1,), 0).copy_(src)
        half = bucket.as_strided((6,), (1,), 6)
        half.add(1.0)
        half[:2].copy_(src[:2])
        bucket.mul(1.0)
    return str(path)


@pytest.mark.parametrize("rule", ["auto", "allclose"])
def test_unwritten_bytes_of_an_empty_are_judged_by_no_rule(tmp_path, rule, capsys):
    """Two runs whose empty buffer holds other leftovers (NaN in one): every op passes; what the
    program wrote is kept (torch: the written elements are the source's)."""
    a = _track_from_start(tmp_path / "a", float("nan"))
    b = _track_from_start(tmp_path / "b", 7.0)
    assert main(["compare", a, b, "--rule", rule, "--json"]) == 0, capsys.readouterr().out
    d = json.loads(capsys.readouterr().out)
    assert d["n_failed"] == 0 and d["n_passed"] > 0
    dump = Dump.open(a)
    last = max(dump.op_records, key=lambda r: r["index"])
    data = dump.load(last)  # the bucket as the program left it (NaN where nothing wrote), kept as it was
    torch.testing.assert_close(data["args"][0][:8], torch.cat([torch.arange(6.0), torch.arange(2.0)]))
    assert data["args"][0][8:].isnan().all()
    assert [r["op"] for r in dump.op_records if r.get("unwritten")] == [
        "aten::empty", "aten::as_strided", "aten::mul", "aten::as_strided", "aten::copy_", "aten::as_strided",
        "aten::add", "aten::slice", "aten::copy_", "aten::mul"]
    reads = [r["op"] for r in d["ops"] if "that no op wrote since an empty*" in r["detail"]]
    assert reads == ["aten::mul", "aten::add", "aten::mul"]  # kernels that computed from leftovers: not judged
    rows = {r["index"]: r for r in d["ops"]}
    assert rows[last["index"]]["status"] == "skipped" and "reads 4 elements of self" in rows[last["index"]]["detail"]
    views = [r for r in d["ops"] if r["op"] == "aten::as_strided"]
    assert views and all(r["status"] == "pass" for r in views)  # judged where written, not where not


def test_a_fault_in_written_bytes_of_a_bucket_is_still_found(tmp_path):
    src = torch.arange(6, dtype=torch.float32)
    paths = []
    for name, scale in (("a", 1.001), ("b", 1.0)):
        with Capture(str(tmp_path / name)):
            bucket = torch.empty(12)
            bucket.as_strided((6,), (1,), 0).copy_(src * scale)
            bucket.as_strided((6,), (1,), 0).mul(2.0)
        paths.append(str(tmp_path / name))
    report = compare_dumps(*paths)
    assert [r["op"] for r in report.failed][:1] == ["aten::mul"]


@pytest.fixture(scope="module")
def ddp_job(tmp_path_factory, launch_gloo):
    pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp("ddp")
    launch_gloo("ditorch_precision.examples.dist_ddp", root, 2, "--fault-rank", "1")
    return root


@pytest.mark.parametrize("rule", ["auto", "allclose"])
def test_ddp_buckets_fault_on_rank_1_only(ddp_job, rule, capsys):
    ops = {r["op"] for r in Dump.open(str(ddp_job / "ref" / "capture" / "rank0")).op_records}
    assert {"aten::empty", "aten::as_strided", "c10d::allreduce_"} <= ops  # DDP's buckets were seen
    assert main(["compare", str(ddp_job / "fault"), str(ddp_job / "ref"), "--rule", rule, "--json"]) == 1
    d = json.loads(capsys.readouterr().out)
    fails_0 = [(r["op"], r["index"], r["detail"]) for r in d["per_rank"]["0"]["ops"] if r["status"] == "fail"]
    if rule == "auto":  # each op judged on its own inputs: rank 1's fault reaches rank 0 only as drift
        assert fails_0 == []
    else:  # compared directly, rank 0's values after the all-reduce differ, but never a bucket's leftovers
        assert not [f for f in fails_0 if f[0] in ("aten::empty", "aten::as_strided")], fails_0[:5]
    fd = d["first_divergence"]
    assert (fd["rank"], fd["op"], fd["module"]) == (1, "aten::mm", f"{DDP}.module.model.layers.1.mlp.down_proj")


def _bucket_program(path, hook, fill):
    """A bucket as DDP fills one (empty, as_strided views, copies in), and a module whose output is
    a view of it, under a stats capture through ``hook``."""
    class Half(torch.nn.Module):
        def forward(self, b):
            return b.as_strided((6,), (1,), 6)

    src = torch.arange(6, dtype=torch.float32)
    with Capture(str(path), mode="stats", hook=hook) as cap:
        bucket = torch.empty(12)
        with torch.no_grad(), Capture.quiet():
            bucket.fill_(fill)  # the allocator's leftovers: no op of the program
        bucket.as_strided((4,), (1,), 6).mul(2.0)
        bucket.as_strided((6,), (1,), 0).copy_(src)
        half = Half()(bucket)
        half.add(1.0)
        half[:2].copy_(src[:2])
        bucket.mul(1.0)
        torch.empty_like(src).zero_().add(src)
    assert cap.hook_used == hook
    with open(path / "index.jsonl") as f:
        return [json.loads(line) for line in f]


def test_the_cpp_hook_counts_unwritten_memory_through_views_as_the_python_hook_does(tmp_path):
    """The C++ observer tracks what empty* allocated through views and writes (counted as 0 in the
    statistics, the count in ``unwritten``): its lines equal the Python hook's, whatever the
    leftovers hold (NaN or 7)."""
    for fill in (float("nan"), 7.0):
        cpp = _bucket_program(tmp_path / f"cpp{fill}", "cpp", fill)
        python = _bucket_program(tmp_path / f"python{fill}", "python", fill)
        assert [r["op"] for r in cpp] == [r["op"] for r in python]
        for a, b in zip(cpp, python):
            assert a == b
        assert [r["op"] for r in cpp if r.get("unwritten")] == [
            "aten::empty", "aten::as_strided", "aten::mul", "aten::as_strided", "aten::copy_", "aten::as_strided",
            "module::output", "aten::add", "aten::slice", "aten::copy_", "aten::mul", "aten::empty_like",
            "aten::zero_"]
        assert all(math.isfinite(s.get("mean", 0.0)) for r in cpp for s in r["stats"])  # no leftover NaN read


@pytest.fixture(scope="module")
def ddp_stats_job(tmp_path_factory, launch_gloo):
    """The same DDP job as ``ddp_job``, as stats captures through the C++ observer."""
    pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp("ddp_cpp")
    launch_gloo("ditorch_precision.examples.dist_ddp", root, 2, "--fault-rank", "1", "--mode", "stats",
                "--hook", "cpp")
    return root


def test_the_cpp_hook_records_a_ddp_job_and_finds_the_fault_on_rank_1_only(ddp_stats_job, ddp_job, capsys):
    """Collectives recorded as the Python hook records them (waited for, their group and ReduceOp),
    the buckets' leftovers never judged: rank 0 clean, and the first divergence over all ranks is
    the planted op on rank 1, where the Python hook's full capture of the same job finds it."""
    rank0 = Dump.open(str(ddp_stats_job / "ref" / "capture" / "rank0"))
    assert rank0.meta["hook"] == "cpp"
    records = rank0.op_records
    assert {"aten::empty", "aten::as_strided", "c10d::allreduce_"} <= {r["op"] for r in records}
    reduces = [r for r in records if r["op"] == "c10d::allreduce_"]
    assert reduces and all(r["reduce_op"] == "SUM" and r["group"] == [0, 1] for r in reduces)
    assert any(r["op"] == "aten::as_strided" and r.get("unwritten") for r in records)  # a bucket's view, part written
    assert main(["compare", str(ddp_stats_job / "fault"), str(ddp_stats_job / "ref"), "--json"]) == 1
    d = json.loads(capsys.readouterr().out)
    assert [r for r in d["per_rank"]["0"]["ops"] if r["status"] == "fail"] == []
    assert [r for r in d["per_rank"]["1"]["ops"] if r["status"] == "fail"]
    fd = d["first_divergence"]
    assert (fd["rank"], fd["op"], fd["module"]) == (1, "aten::mm", f"{DDP}.module.model.layers.1.mlp.down_proj")
    assert main(["compare", str(ddp_job / "fault"), str(ddp_job / "ref"), "--json"]) == 1
    python = json.loads(capsys.readouterr().out)["first_divergence"]
    assert (python["rank"], python["op"], python["module"], python["step"]) == (
        fd["rank"], fd["op"], fd["module"], fd["step"])


@pytest.mark.parametrize("mode", ["full", pytest.param("stats", marks=pytest.mark.slow)])  # 4 gloo jobs each
def test_ddp_gradients_as_bucket_views_against_copies_pass_and_a_fault_is_still_found(tmp_path, launch_gloo,
                                                                                       mode):
    """The run under test keeps DDP's gradients as views of its buckets, the reference copies them out
    (``copy_`` ops of the reference only, in backward outside any module): those copies hand on what
    they were given, so the pair passes at every step (before: each step's backward region 'could not be
    judged', exit 1); with a fault on rank 1 too, the first divergence is still the planted op."""
    pytest.importorskip("transformers")
    launch_gloo("ditorch_precision.examples.dist_ddp", tmp_path / "honest", 2, "--bucket-view", "--steps", "2",
                "--mode", mode)
    launch_gloo("ditorch_precision.examples.dist_ddp", tmp_path / "faulty", 2, "--bucket-view", "--steps", "2",
                "--mode", mode, "--fault-rank", "1")
    honest = compare_ranks(str(tmp_path / "honest" / "fault" / "capture"), str(tmp_path / "honest" / "ref" / "capture"))
    for report in honest.reports.values():
        assert report.passed, [(r["op"], r["step"], r["detail"]) for r in report.failed + [
            g for g in report.regions if g["verdict"] == "unjudged"]]
        copies = [r for r in report.unmatched if r["op"] == "aten::copy_" and r["run"] == "B"]
        assert {r["step"] for r in copies} == {0, 1}  # the difference was there to judge
    faulty = compare_ranks(str(tmp_path / "faulty" / "fault" / "capture"), str(tmp_path / "faulty" / "ref" / "capture"))
    fd = faulty.first_divergence
    assert (fd["rank"], fd["op"], fd["module"]) == (1, "aten::mm", f"{DDP}.module.model.layers.1.mlp.down_proj")
