"""Arguments are data: an aligned op's non-tensor arguments and its tensors' shapes and dtypes are
compared between the runs, so a config value or a scale factor that differs is found by the default
rule, named with both values, and ranked in time with numerical divergences. References: the
planted change itself and plain transformers/torch (the runs' losses and outputs differ)."""
import json
from contextlib import nullcontext

import pytest
import torch

from ditorch_precision import Capture, compare_dumps
from ditorch_precision.cli import main
from ditorch_precision.examples.faults import wrong_kernel
from ditorch_precision.examples.hf_llama import HFLlamaSize, hf_batches, hf_train_step, make_hf_llama

pytestmark = pytest.mark.usefixtures("one_thread")
SIZE = HFLlamaSize()
NORM = "LlamaForCausalLM.model.layers.1.input_layernorm"


def _llama_run(path, eps: float | None = None) -> float:
    pytest.importorskip("transformers")
    model = make_hf_llama(SIZE)
    if eps is not None:  # one layer's RMSNorm built with another eps (HF keeps it as variance_epsilon)
        model.model.layers[1].input_layernorm.variance_epsilon = eps
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with Capture(str(path)):
        return hf_train_step(model, opt, hf_batches(SIZE, 1)[0]).item()


def test_an_rmsnorm_eps_that_differs_is_found_by_the_default_rule(tmp_path, capsys):
    """HF LlamaForCausalLM, layer 1's input RMSNorm with eps 1e-2 instead of 1e-6: every op replays
    exactly from its own inputs, so only the arguments tell (before: exit 0, 'no divergence')."""
    loss_a = _llama_run(tmp_path / "a", eps=1e-2)
    loss_b = _llama_run(tmp_path / "b")
    assert loss_a != loss_b  # plain transformers: the change matters
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--json"]) == 1
    d = json.loads(capsys.readouterr().out)
    fd = d["first_divergence"]
    assert (fd["op"], fd["module"], fd["phase"], fd["rule"]) == ("aten::add", NORM, "forward", "arguments")
    assert fd["detail"].startswith("argument other: 0.01 in A, 1e-06 in B")
    assert d["n_failed"] == 1


class _Scaled(torch.nn.Module):
    def __init__(self, scale: float, dim: int = -1):
        super().__init__()
        self.lin, self.act = torch.nn.Linear(8, 8), torch.nn.Sequential(torch.nn.SiLU())
        self.scale, self.dim = scale, dim

    def forward(self, x):
        return torch.softmax(self.act(self.lin(x)) * self.scale, dim=self.dim)


def _small(path, scale=0.125, dim=-1, mode="full", fault=False):
    torch.manual_seed(0)
    model, x = _Scaled(scale, dim), torch.randn(8, 8)
    plant = wrong_kernel("silu", 1 + 1e-3) if fault else nullcontext()
    with plant, Capture(str(path), mode=mode):
        model(x).sum().backward()
    return str(path)


@pytest.mark.parametrize("mode", ["full", "stats", "checksum"])
def test_a_scale_factor_and_a_dim_that_differ_are_named_in_every_capture_mode(tmp_path, mode):
    a = _small(tmp_path / "a", scale=0.125 * 1.001, dim=0, mode=mode)
    b = _small(tmp_path / "b", mode=mode)
    report = compare_dumps(a, b)
    fails = [(r["op"], r["phase"], r["rule"], r["detail"].split(" (outputs")[0]) for r in report.failed]
    assert fails[:2] == [("aten::mul", "forward", "arguments", "argument other: 0.125125 in A, 0.125 in B"),
                         ("aten::_softmax", "forward", "arguments", "argument dim: 0 in A, -1 in B")]
    assert report.first_divergence["op"] == "aten::mul"


def test_argument_and_numerical_divergences_are_ranked_in_time(tmp_path):
    """A silu 1e-3 off (earlier) and a scale factor that differs (later): both fail, the silu first."""
    a = _small(tmp_path / "a", scale=0.25, fault=True)
    b = _small(tmp_path / "b")
    report = compare_dumps(a, b)
    fails = [(r["op"], r["phase"], r["rule"]) for r in report.failed]
    assert fails[0] == ("aten::silu", "forward", "error_ratio") and ("aten::mul", "forward", "arguments") in fails
    assert [r["index"] for r in report.failed] == sorted(r["index"] for r in report.failed)


def test_a_known_benign_argument_difference_comes_from_the_table(tmp_path, capsys):
    a = _small(tmp_path / "a", dim=0)
    b = _small(tmp_path / "b", dim=1)  # softmax over the other dim of a square input: same shapes
    assert main(["compare", a, b]) == 1
    out = capsys.readouterr().out
    assert "argument dim: 0 in A, 1 in B" in out
    mapping = tmp_path / "map.json"
    mapping.write_text(json.dumps({"ignore_arguments": {"aten::_softmax": ["dim"]}}))
    # with dim ignored the softmax's outputs still differ (its values), so it fails by its numbers
    report_rows = json.loads(_json(["compare", a, b, "--map", str(mapping), "--json"], capsys))
    softmax = [r for r in report_rows["ops"] if r["op"] == "aten::_softmax"]
    assert softmax and all(r["rule"] != "arguments" for r in softmax)
    mapping.write_text(json.dumps({"ignore_arguments": {"aten::_softmax": "dim"}}))
    assert main(["compare", a, b, "--map", str(mapping)]) == 2
    assert "ignore_arguments" in capsys.readouterr().err


def _json(argv, capsys) -> str:
    main(argv)
    return capsys.readouterr().out
