"""Stats captures of BERT, sdpa against eager attention: an honest pair, quiet at every step.

Before, the compare failed it at step 0 in two places. Inside the attention (a region: the op sequences
differ) sdpa's math path and eager's matmuls both run expand / clone / bmm, paired by name and shape
although called with other inputs (sdpa scales q and k by sqrt(scale), eager scales the scores): their
statistics were compared directly, 60 failures. And the gradient of a key projection's bias is a sum
that cancels to rounding noise (softmax ignores a shift of every score in a row: zero in exact
arithmetic, about 1e-12 here), judged against its own tiny size. A stats capture now keeps a
reduction's input statistics, judges the sum (and the same numbers after it) at the magnitude of what it
added up, and takes the optimizer's steps on a gradient that is rounding noise as drift. References:
transformers (both attention implementations are honest: their losses agree to rtol 1e-5), torch's own
statistics of the reduced tensor, and the planted faults' places."""
import json
import math
from contextlib import nullcontext

import pytest
import torch

from ditorch_precision import Capture, compare_dumps
from ditorch_precision.examples.faults import wrong_kernel

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")
STEPS = 3
VOCAB, SEQ = 64, 32


def _bert(attn: str):
    cfg = transformers.BertConfig(vocab_size=VOCAB, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=256, max_position_embeddings=SEQ, attn_implementation=attn,
                                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    return transformers.BertForMaskedLM(cfg)


def _run(path, attn: str, hook: str = "auto", fault: str | None = None) -> list[float]:
    model = _bert(attn)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, VOCAB, (4, SEQ), generator=g) for _ in range(STEPS)]  # drawn outside: data
    layer = model.bert.encoder.layer[1]
    losses = []
    with Capture(str(path), mode="stats", hook=hook):
        for step, ids in enumerate(batches):
            plant = nullcontext()
            if fault == "mlp" and step == STEPS - 1:  # after the attention, outside any region
                plant = wrong_kernel("gelu", 1 + 1e-3, inside=layer.intermediate)
            elif fault == "attention" and step == STEPS - 1:  # inside the region: eager's matmuls
                plant = wrong_kernel("bmm", 1 + 1e-3, inside=layer.attention.self)
            with plant:
                loss = model(input_ids=ids, labels=ids).loss
                loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
    return losses


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("bert")
    losses = {"eager": _run(root / "eager", "eager"), "sdpa": _run(root / "sdpa", "sdpa")}
    _run(root / "sdpa_python", "sdpa", hook="python")
    _run(root / "mlp_fault", "sdpa", fault="mlp")
    _run(root / "attention_fault", "eager", fault="attention")
    return root, losses


def _failed(report) -> list:
    return [(r["op"], r["module"], r["step"], r["detail"]) for r in report.failed]


@pytest.mark.parametrize("run", ["sdpa", "sdpa_python"])
def test_bert_sdpa_against_eager_in_stats_captures_passes_at_every_step(runs, run):
    root, losses = runs
    torch.testing.assert_close(losses["sdpa"], losses["eager"], rtol=1e-5, atol=0)  # transformers: honest
    report = compare_dumps(str(root / run), str(root / "eager"))
    assert report.passed, _failed(report)
    # judged, not skipped: the attention by its module records at every step, the key bias's sums at the
    # size of what they add up
    attn = [r for r in report.regions if r["module"].endswith("layer.1.attention.self")]
    assert {r["step"] for r in attn} == set(range(STEPS)) and all(r["verdict"] == "pass" for r in attn)
    sums = [r for r in report.ops if r["op"] == "aten::sum" and r["module"].endswith("attention.self.key")]
    assert len(sums) == 2 * STEPS and all(r["status"] == "pass" for r in sums), sums


def test_a_reductions_input_statistics_are_torchs(runs):
    root, _ = runs
    for run in ("sdpa", "sdpa_python"):  # the C++ observer and the Python hook write the same field
        lines = [json.loads(x) for x in (root / run / "index.jsonl").read_text().splitlines()]
        sums = [r for r in lines if r["op"] == "aten::sum" and (r["module"] or "").endswith("attention.self.key")]
        assert sums and all("input_stats" in r for r in sums)
        for r in sums:
            got, out = r["input_stats"], r["stats"][0]
            assert got["numel"] == math.prod(r["inputs"][0]["shape"]) and got["dtype"] == "float32"
            # what it reduced is far larger than its result: the sum cancels
            assert out["norm"] < 1e-6 * got["norm"], (out, got)
    x = torch.randn(4, SEQ, 128, dtype=torch.float32)
    model = _bert("eager")
    with Capture(str(root / "one_sum"), mode="stats"):
        x.sum((0, 1))
        model.cls.predictions.decoder.weight.mean()
    for line in (root / "one_sum" / "index.jsonl").read_text().splitlines():
        r = json.loads(line)
        t = {"aten::sum": x, "aten::mean": model.cls.predictions.decoder.weight}[r["op"]].detach().double()
        s = r["input_stats"]
        assert (s["min"], s["max"]) == (t.min().item(), t.max().item())
        assert math.isclose(s["mean"], t.mean().item(), rel_tol=1e-12, abs_tol=1e-15)
        assert math.isclose(s["norm"], t.norm().item(), rel_tol=1e-12)


def test_a_fault_after_the_attention_is_still_found(runs):
    root, _ = runs
    report = compare_dumps(str(root / "mlp_fault"), str(root / "eager"))
    fd = report.first_divergence
    assert fd is not None and (fd["op"], fd["module"], fd["phase"], fd["step"]) == (
        "aten::gelu", "BertForMaskedLM.bert.encoder.layer.1.intermediate.intermediate_act_fn", "forward", STEPS - 1), fd
    assert all(r["step"] == STEPS - 1 for r in report.failed), _failed(report)


def test_a_fault_inside_the_attention_fails_its_region(runs):
    """Eager attention with a wrong bmm against sdpa's one kernel: the region's module records fail, and
    nothing before them (the op that reads the region's output shares its call number)."""
    root, _ = runs
    report = compare_dumps(str(root / "attention_fault"), str(root / "sdpa"))
    module = "BertForMaskedLM.bert.encoder.layer.1.attention.self"
    region = [r for r in report.regions if r["module"] == module and r["step"] == STEPS - 1
              and r["phase"] == "forward"]
    assert [r["verdict"] for r in region] == ["fail"], report.regions
    output = [r for r in report.failed if r["op"] == "module::output" and r["module"] == module]
    fd = report.first_divergence
    assert output and fd is not None and fd["index"] == output[0]["index"] and fd["step"] == STEPS - 1, fd
    assert all(r["step"] == STEPS - 1 for r in report.failed), _failed(report)


@pytest.mark.parametrize("hook", ["cpp", "python"])
def test_every_reduction_writes_its_inputs_statistics_in_both_hooks(tmp_path, hook):
    """Every op of summaries.REDUCTIONS (the C++ observer names them apart, kReductions) writes the statistics
    of its first argument, against plain torch's in float64: x for the forward ones, the output gradient
    (ones: the loss is a sum) for layer norm's backward."""
    from ditorch_precision.summaries import REDUCTIONS

    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 6, 8, generator=g)
    w = torch.ones(8, requires_grad=True)
    with Capture(str(tmp_path / hook), mode="stats", hook=hook):
        x.sum((0, 1)), x.nansum(), x.mean(-1)
        torch.nn.functional.layer_norm(x, (8,), w).sum().backward()
        torch.nn.functional.group_norm(x, 2)
        torch.nn.functional.batch_norm(x, None, None, training=True)
    records = [json.loads(line) for line in (tmp_path / hook / "index.jsonl").read_text().splitlines()]
    seen: dict = {}
    for r in records:  # the first of each: x's (the loss's sum and layer norm's backward sum others)
        if r["op"] in REDUCTIONS:
            seen.setdefault(r["op"], r)
    batch_norm = {"aten::native_batch_norm", "aten::_native_batch_norm_legit"}
    assert set(seen) - batch_norm == set(REDUCTIONS) - batch_norm and set(seen) & batch_norm, sorted(seen)
    for op, r in seen.items():
        t = torch.ones(4, 6, 8) if op == "aten::native_layer_norm_backward" else x
        t = t.double()
        s = r["input_stats"]
        assert s["numel"] == t.numel() and (s["min"], s["max"]) == (t.min().item(), t.max().item()), op
        assert math.isclose(s["mean"], t.mean().item(), rel_tol=1e-12, abs_tol=1e-15), op
        assert math.isclose(s["norm"], t.norm().item(), rel_tol=1e-12), op
