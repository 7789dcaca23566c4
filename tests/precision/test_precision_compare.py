"""Capture two real training runs of a small LLaMA-style model on the CPU (the CPU in float32 stands
in for the device), one with a deliberately wrong ATen kernel (aten::silu overridden through
torch.library), and check that `precision-diff compare`/`replay`, run as subprocesses, name it."""
import json
import subprocess
import sys

import pytest
import torch

from ditorch_precision import Capture, compare_dumps
from ditorch_precision.cli import main
from ditorch_precision.examples.faults import wrong_kernel
from ditorch_precision.examples.tiny_llama import LlamaConfig, train
from program_ops import OpLog

CFG = LlamaConfig(dim=32, hidden=64, heads=4, seq=8, batch=2, layers=2)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        root = tmp_path_factory.mktemp("captures")
        with OpLog() as log:
            train(1, CFG, optimizer="sgd")
        with Capture(str(root / "ref")):
            ref_losses = train(1, CFG, optimizer="sgd")
        with Capture(str(root / "ref2")):
            train(1, CFG, optimizer="sgd")
        with wrong_kernel("silu", scale=1 + 1e-3):
            with Capture(str(root / "bad")):
                bad_losses = train(1, CFG, optimizer="sgd")
    finally:
        torch.set_num_threads(threads)
    return {"root": root, "ops": log.ops, "ref_losses": ref_losses, "bad_losses": bad_losses}


def cli(*args):
    return subprocess.run([sys.executable, "-m", "ditorch_precision.cli", *map(str, args)], capture_output=True,
                          text=True,
                          timeout=300)


def test_planted_kernel_is_wrong_inside_and_restored_after():
    x = torch.linspace(-3, 3, 7)
    honest = x * torch.sigmoid(x)
    with wrong_kernel("silu", scale=1 + 1e-3):
        wrong = torch.nn.functional.silu(x)
        right64 = torch.nn.functional.silu(x.double())  # other dtypes (the float64 reference) stay right
    torch.testing.assert_close(wrong, honest * (1 + 1e-3))
    torch.testing.assert_close(right64, honest.double(), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(torch.nn.functional.silu(x), honest)


def test_compare_names_the_planted_op_first_and_nothing_before(runs, tmp_path):
    root = runs["root"]
    expected_index = runs["ops"].index("aten::silu")
    p = cli("compare", root / "bad", root / "ref", "--json", "--csv", tmp_path / "d.csv", "--html", tmp_path / "d.html")
    assert p.returncode == 1, p.stderr
    d = json.loads(p.stdout)
    fd = d["first_divergence"]
    assert fd["op"] == "aten::silu" and fd["index"] == expected_index
    assert fd["module"] == "TinyLlama.layers.0.mlp" and fd["phase"] == "forward"
    # the model's parameters and buffers before its first op: the same in both runs
    state = [r for r in d["ops"] if r["op"] == "module::state"]
    assert [(r["module"], r["status"], r["rule"]) for r in state] == [("TinyLlama", "pass", "state")], state
    assert runs["ops"][state[0]["index"]] == "aten::embedding"  # ranked at the model's first op
    # and what it was fed at each step (token ids): the same
    fed = [r for r in d["ops"] if r["op"] == "module::input"]
    assert fed and all(r["status"] == "pass" and r["rule"] == "data" for r in fed), fed
    ops = [r for r in d["ops"] if r["op"] not in ("module::state", "module::input")]
    before = [r for r in ops if r["index"] < expected_index]
    assert len(before) == expected_index - sum(o.startswith("profiler::") for o in runs["ops"][:expected_index])
    assert all(r["status"] != "fail" for r in before)
    assert sum(r["status"] == "pass" for r in before) > 50
    assert [r["op"] for r in ops] == [o for o in runs["ops"] if not o.startswith("profiler::")]
    assert (tmp_path / "d.csv").read_text().count("\n") == len(d["ops"]) + 1
    assert "aten::silu" in (tmp_path / "d.html").read_text()


def test_compare_of_two_honest_runs_passes(runs, capsys):
    assert main(["compare", str(runs["root"] / "ref2"), str(runs["root"] / "ref")]) == 0
    assert "no divergence" in capsys.readouterr().out


def test_error_ratio_rule_blames_only_the_planted_op(runs):
    report = compare_dumps(str(runs["root"] / "bad"), str(runs["root"] / "ref"), ratio_k=4.0)
    failed = {r["op"] for r in report.failed}
    assert failed == {"aten::silu"}  # every other op is judged on its own inputs: drift is not blamed
    assert report.first_divergence["index"] == runs["ops"].index("aten::silu")
    # random ops: by their own draws; the model's weights before its first op: equal, element for element
    judged = [r for r in report.ops
              if r["status"] != "skipped" and r["rule"] not in ("exact", "random_contract", "state", "data")]
    assert judged and all(r["rule"] == "error_ratio" for r in judged)


def test_replay_cli_detects_the_wrong_kernel(runs):
    index = runs["ops"].index("aten::silu")
    p = cli("replay", runs["root"] / "bad", index, "--device", "cpu", "--dtype", "float64", "--json")
    assert p.returncode == 1, p.stderr
    d = json.loads(p.stdout)
    assert d["op"] == "aten::silu" and d["passed"] is False and d["rule"] == "allclose"
    assert d["max_rel"] == pytest.approx(1e-3, rel=0.05)
    assert main(["replay", str(runs["root"] / "ref"), str(index), "--dtype", "float64"]) == 0


def test_compare_rejects_a_non_capture_with_exit_2(tmp_path, runs, capsys):
    assert main(["compare", str(tmp_path), str(runs["root"] / "ref")]) == 2
    err = capsys.readouterr().err
    assert "index.jsonl" in err and str(tmp_path) in err
