"""Random ops are judged by their contracts on each run's own draws (ditorch_precision.random_contracts),
on a HuggingFace LlamaForCausalLM (random weights, AdamW) with attention dropout: the reference
draws other numbers (another seed, as another device would), and the run under test carries a fault
in layer 0's silu and then one in layer 1's dropout draws. References: the places the test planted
faults, the dropout probability the model was configured with, and plain torch's draws (equal for
equal seeds)."""
import json
from contextlib import nullcontext

import pytest
import torch

from ditorch_precision import AutoCompare, Capture, compare_dumps
from ditorch_precision.cli import main
from ditorch_precision.dump import Dump
from ditorch_precision.examples.faults import device_only_kernel, wrong_draws, wrong_kernel
from ditorch_precision.examples.hf_llama import HFLlamaSize, hf_batches, hf_train, make_hf_llama

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")

SIZE = HFLlamaSize(seq=32)  # 8192 dropout draws per layer: enough for the mean's bound
ROOT = "LlamaForCausalLM.model.layers"
DROPOUT = 0.1


def _times_one(module, args, kwargs):
    return args, {**kwargs, "hidden_states": kwargs["hidden_states"] * 1.0}


MM_IN_LAYER_1 = ("mm", 1 + 1e-4, lambda m: m.model.layers[1].mlp.down_proj)


def _capture(path, draw_seed: int = 0, faults: bool = False, insert: bool = False, attn: str = "eager",
             fault=None, device_only: bool = False, mode: str = "full") -> str:
    model = make_hf_llama(SIZE, attn)
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = DROPOUT
    if insert:  # one extra op in layer 1's attention: its op sequence differs from the reference's
        model.model.layers[1].self_attn.register_forward_pre_hook(_times_one, with_kwargs=True)
    torch.manual_seed(draw_seed)  # the dropout draws
    plants = (wrong_kernel("silu", 1 + 1e-3, inside=model.model.layers[0].mlp.act_fn),
              wrong_draws(1.05, inside=model.model.layers[1].self_attn)) if faults else (nullcontext(), nullcontext())
    plant = wrong_kernel(fault[0], fault[1], inside=fault[2](model)) if fault else nullcontext()
    # A kernel only this run's torch has, 1e-3 off, scaling the hidden states entering layer 1's
    # attention (after layer 0's dropout): nothing can replay it, so only module records show it.
    kernel = device_only_kernel(1 + 1e-3) if device_only else nullcontext()
    with plants[0], plants[1], plant, kernel as scale, Capture(str(path), mode=mode):
        if scale is not None:
            model.model.layers[1].self_attn.register_forward_pre_hook(
                lambda m, a, kw: (a, {**kw, "hidden_states": scale(kw["hidden_states"], 1.0)}), with_kwargs=True)
        hf_train(model, hf_batches(SIZE, 1))
    return str(path)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("random")
    return {"ref": _capture(root / "ref", draw_seed=1), "honest": _capture(root / "honest"),
            "faults": _capture(root / "faults", faults=True, insert=True),
            "sdpa": _capture(root / "sdpa", attn="sdpa"),
            "sdpa_fault": _capture(root / "sdpa_fault", attn="sdpa", fault=MM_IN_LAYER_1),
            "device_only": _capture(root / "device_only", device_only=True)}


def _failed(report):
    return [(r["op"], r["module"], r["phase"]) for r in report.failed]


def test_the_runs_draw_different_dropout_masks(runs):
    masks = []
    for name in ("ref", "honest"):
        d = Dump.open(runs[name])
        rec = next(r for r in d.op_records if r["op"] == "aten::bernoulli_")
        masks.append(d.load(rec)["outputs"])
        assert abs(float(masks[-1].mean()) - (1 - DROPOUT)) < 0.02  # the configured keep probability
    assert not torch.equal(*masks)


def test_honest_runs_with_other_draws_pass(runs):
    report = compare_dumps(runs["honest"], runs["ref"])
    assert report.passed, _failed(report)
    judged = [r for r in report.ops if r["op"] == "aten::bernoulli_"]
    assert len(judged) == 2 and all(r["rule"] == "random_contract" and r["status"] == "pass" for r in judged)


def _masks(run: str) -> list[torch.Tensor]:
    d = Dump.open(run)
    return [d.load(r)["outputs"] for r in d.op_records if r["op"] == "aten::bernoulli_"]


def test_a_fault_only_a_module_record_shows_after_the_same_draws_fails_naming_its_module(runs, capsys):
    """Both runs draw with one seed (plain torch: the same masks); the run under test scales layer
    1's attention input by a kernel the comparing torch does not know, 1e-3 off. Its region (one op
    more) is judged by module records: the first that differs, q_proj's output, comes after layer
    0's dropout, which drew the same numbers in both runs, so it is the divergence and fails. With
    the reference's other seed, the same record is drift: other draws could explain it."""
    same, other = _masks(runs["device_only"]), _masks(runs["honest"])
    assert len(same) == 2 and all(torch.equal(x, y) for x, y in zip(same, other))
    assert main(["compare", runs["device_only"], runs["honest"], "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    failed = [r for r in report["ops"] if r["status"] == "fail"]
    assert [(r["op"], r["module"], r["phase"]) for r in failed] == [
        ("module::output", f"{ROOT}.1.self_attn.q_proj", "forward")]
    assert report["first_divergence"]["module"] == f"{ROOT}.1.self_attn.q_proj"
    draws = [r for r in report["ops"] if r["op"] == "aten::bernoulli_"]
    assert len(draws) == 2 and all(r["same_draws"] is True for r in draws)
    assert failed[0]["index"] > draws[0]["index"]  # after a draw
    unmatched = [r for r in report["unmatched"] if r["run"] == "A"]
    assert [r["op"] for r in unmatched] == ["precision_faults::scale", "aten::mul"]  # its forward and backward
    verdicts = {(r["module"], r["phase"]): r["verdict"] for r in report["regions"]}
    assert verdicts[(f"{ROOT}.1.self_attn", "forward")] == "fail"
    drifted = compare_dumps(runs["device_only"], runs["ref"])  # other draws (seed 1)
    assert drifted.passed and not drifted.failed
    assert all(r["same_draws"] is False for r in drifted.ops if r["op"] == "aten::bernoulli_")
    assert {(r["module"], r["phase"]): r["verdict"] for r in drifted.regions}[
        (f"{ROOT}.1.self_attn", "forward")] == "drift"


def test_in_stats_captures_the_same_draws_are_told_by_their_statistics(tmp_path):
    """The same runs in stats captures: a draw's statistics the very same numbers count as the same draws
    (before, a stats capture never could tell, and the q_proj record after layer 0's dropout was drift
    whatever the seeds), other seeds' draws do not."""
    device_only = _capture(tmp_path / "device_only", device_only=True, mode="stats")
    same = compare_dumps(device_only, _capture(tmp_path / "honest", mode="stats"))
    assert [r["same_draws"] for r in same.ops if r["op"] == "aten::bernoulli_"] == [True, True]
    # the first value after the draws that differs fails (in stats captures, q_proj's first op reading it)
    assert [r["module"] for r in same.failed][:1] == [f"{ROOT}.1.self_attn.q_proj"]
    other = compare_dumps(device_only, _capture(tmp_path / "ref", draw_seed=1, mode="stats"))
    assert [r["same_draws"] for r in other.ops if r["op"] == "aten::bernoulli_"] == [False, False]


def test_in_stats_captures_other_draws_are_judged_by_their_contract_and_faulty_draws_found(tmp_path):
    """Runs that draw other numbers (another seed, as another device would) in stats captures. Before, the
    compare failed the first draw (its statistics are not the reference's) and every op after it. Now a
    draw is judged by its contract from its statistics (0 or 1 each, as values in [0, 1] whose squares
    sum to their sum are; their mean the keep probability within 6 standard errors), and what follows
    other draws is drift, as module records after them already were (without tensors, no op can be
    replayed on its own inputs). Layer 1's faulty draws (a keep probability 1.05 x the configured one:
    13 standard errors over 8192 draws) are found there, by their contract; layer 0's silu fault, after
    layer 0's other draws, is drift: it takes a full capture. References: the configured dropout, the
    places the faults were planted."""
    ref = _capture(tmp_path / "ref", draw_seed=1, mode="stats")
    honest = compare_dumps(_capture(tmp_path / "honest", mode="stats"), ref)
    assert honest.passed, _failed(honest)
    draws = [r for r in honest.ops if r["op"] == "aten::bernoulli_"]
    assert len(draws) == 2 and all(r["rule"] == "random_contract" and r["status"] == "pass" and
                                   r["same_draws"] is False for r in draws), draws
    assert any(r["status"] == "drift" and "after random draws" in r["detail"] for r in honest.ops)
    faults = compare_dumps(_capture(tmp_path / "faults", faults=True, mode="stats"), ref)
    fd = faults.first_divergence
    assert fd is not None and (fd["op"], fd["module"], fd["rule"]) == (
        "aten::bernoulli_", f"{ROOT}.1.self_attn", "random_contract"), fd
    assert "bernoulli: mean of 8192 draws" in fd["detail"]


def test_a_fault_in_the_draws_after_an_earlier_fault_is_located(runs):
    """After the silu's divergence, layer 1's faulty draws are named; its attention runs one op more
    than the reference's (a region, whose module records differ after the divergence), and the
    faulty op inside it makes the region fail, not drift."""
    report = compare_dumps(runs["faults"], runs["ref"])
    assert _failed(report) == [("aten::silu", f"{ROOT}.0.mlp.act_fn", "forward"),
                               ("aten::bernoulli_", f"{ROOT}.1.self_attn", "forward")]
    assert "mean of 8192 draws" in report.failed[1]["detail"]
    verdicts = {(r["module"], r["phase"]): r["verdict"] for r in report.regions}
    assert verdicts[(f"{ROOT}.1.self_attn", "forward")] == "fail"
    assert [r["op"] for r in report.unmatched] == ["aten::mul"] * 2  # the extra op, forward and backward


def test_autocompare_judges_the_draws_where_they_are_made():
    model = make_hf_llama(SIZE)
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = DROPOUT
    with wrong_draws(1.05, inside=model.model.layers[1].self_attn), AutoCompare() as ac:
        hf_train(model, hf_batches(SIZE, 1))
    draws = [r for r in ac.results if r["op"] == "aten::bernoulli_"]
    assert [(r["module"], r["status"], r["rule"]) for r in draws] == [
        (f"{ROOT}.0.self_attn", "pass", "random_contract"), (f"{ROOT}.1.self_attn", "fail", "random_contract")]
    assert [r["op"] for r in ac.failures] == ["aten::bernoulli_"]


def test_the_contracts_of_dropout_and_of_uniform_and_normal_draws():
    """Plain torch draws pass; the same draws altered as a faulty kernel would fail."""
    from ditorch_precision.random_contracts import contract_verdict

    aten = torch.ops.aten
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, generator=g)
    out, mask = aten.native_dropout.default(x, 0.3, True)
    assert contract_verdict(aten.native_dropout.default, (x, 0.3, True), {}, (out, mask))[0] == "pass"
    for bad in ((out * 1.001, mask), (out, mask & (torch.rand(4096, generator=g) < 0.9))):  # values, keep rate
        assert contract_verdict(aten.native_dropout.default, (x, 0.3, True), {}, bad)[0] == "fail"
    u = torch.empty(4096).uniform_(-2, 2, generator=g)
    assert contract_verdict(aten.uniform_.default, (u, -2.0, 2.0), {}, u)[0] == "pass"
    assert contract_verdict(aten.uniform_.default, (u, -2.0, 2.0), {}, u * 0.5 + 0.5)[0] == "fail"  # biased
    n = torch.empty(4096).normal_(1.0, 3.0, generator=g)
    assert contract_verdict(aten.normal_.default, (n, 1.0, 3.0), {}, n)[0] == "pass"
    assert contract_verdict(aten.normal_.default, (n, 1.0, 3.0), {}, (n - 1) * 1.2 + 1)[0] == "fail"  # too wide
    with_nan = n.clone()
    with_nan[7] = float("nan")  # passed before: a NaN mean is never outside a bound
    assert contract_verdict(aten.normal_.default, (with_nan, 1.0, 3.0), {}, with_nan)[0] == "fail"


def test_the_contracts_judged_from_statistics_agree_with_those_judged_from_the_draws():
    """A stats capture's contract (stats_contract_verdict: min, max, mean and norm only) passes plain torch's
    draws and fails the same draws altered as a faulty kernel would, as the contract on the tensors does."""
    from ditorch_precision.random_contracts import contract_verdict, stats_contract_verdict
    from ditorch_precision.summaries import tensor_stats

    aten = torch.ops.aten
    g = torch.Generator().manual_seed(0)
    b = torch.empty(4096).bernoulli_(0.9, generator=g)
    u = torch.empty(4096).uniform_(-2, 2, generator=g)
    n = torch.empty(4096).normal_(1.0, 3.0, generator=g)
    cases = [  # (op, its scalar arguments, draws, expected)
        (aten.bernoulli_.float, {"p": 0.9}, b, "pass"),
        (aten.bernoulli_.float, {"p": 0.9}, b * 0.999, "fail"),  # not 0 or 1
        (aten.bernoulli_.float, {"p": 0.8}, b, "fail"),  # keeps too many
        (aten.uniform_.default, {"from": -2.0, "to": 2.0}, u, "pass"),
        (aten.uniform_.default, {"from": -2.0, "to": 2.0}, u * 0.5 + 0.5, "fail"),  # biased
        (aten.uniform_.default, {"from": -1.0, "to": 2.0}, u, "fail"),  # outside
        (aten.normal_.default, {"mean": 1.0, "std": 3.0}, n, "pass"),
        (aten.normal_.default, {"mean": 1.0, "std": 3.0}, (n - 1) * 1.2 + 1, "fail"),  # too wide
        (aten.normal_.default, {"mean": 1.0, "std": 3.0}, n + 0.5, "fail"),  # shifted
    ]
    for op, scalars, draws, expected in cases:
        args = (draws, *scalars.values())
        assert contract_verdict(op, args, {}, draws)[0] == expected, (op, scalars, expected)
        got = stats_contract_verdict(op._schema.name, {"self": {}, **scalars}, [tensor_stats(draws)])
        assert got is not None and got[0] == expected, (op, scalars, got)
    # a probability given as a tensor: the statistics say nothing of the expected mean
    assert stats_contract_verdict("aten::bernoulli_", {"self": {}, "p": {"shape": [4096]}}, [tensor_stats(b)]) is None


def _masked_add(run: str) -> torch.Tensor:
    """The output of layer 0's attention-mask add (scores + mask: masked values at the dtype's lowest
    or below) in a capture. sdpa's math path adds the mask in place (add_), and out of place (add)
    under a dispatch mode (the Python hook): torch's kernels take their out-of-place paths then."""
    d = Dump.open(run)
    adds = (d.load(r)["outputs"] for r in d.op_records if r["op"] in ("aten::add", "aten::add_")
            and r["module"] == f"{ROOT}.0.self_attn" and r["phase"] == "forward")
    return next(out for out in adds if float(out.min()) <= torch.finfo(torch.float32).min)


def test_sdpa_against_eager_attention_with_dropout_passes_and_names_a_planted_mm(runs, capsys):
    """sdpa's math path (taken with dropout on the CPU) masks with -inf, eager attention with the
    dtype's lowest value: plain torch's softmax zeroes the same positions of both, so the mask add is
    not a difference; the attention outputs differ by the draws only (drift, not fail). A 1e-4 fault
    in layer 1's down projection, after the draws, is the only failure."""
    sdpa, eager = _masked_add(runs["sdpa"]), _masked_add(runs["ref"])
    masked = sdpa == -torch.inf
    assert masked.any() and torch.equal(masked, eager == torch.finfo(torch.float32).min)
    assert torch.equal(torch.softmax(sdpa, -1) == 0, torch.softmax(eager, -1) == 0)
    report = compare_dumps(runs["sdpa"], runs["ref"])
    assert report.passed, _failed(report)
    adds = [r for r in report.ops if r["op"] == "aten::add" and r["module"] == f"{ROOT}.0.self_attn"
            and r["phase"] == "forward"]
    assert adds and all(r["status"] == "pass" for r in adds)
    attn = {(r["module"], r["phase"]): r["verdict"] for r in report.regions}
    assert attn[(f"{ROOT}.0.self_attn", "forward")] == "drift"  # its output after other draws
    assert main(["compare", runs["sdpa"], runs["ref"]]) == 0
    assert "no divergence located; 5 regions drift" in capsys.readouterr().out  # not "no divergence"
    assert _failed(compare_dumps(runs["sdpa_fault"], runs["ref"])) == [
        ("aten::mm", f"{ROOT}.1.mlp.down_proj", "forward")]
