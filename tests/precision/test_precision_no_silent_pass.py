"""No silent passes and no wrong blame, on a HuggingFace LlamaForCausalLM with random weights trained
with AdamW on the CPU (CPU float32 stands in for the device; the reference is CPU float64 or a
second float32 run): a 1e-4 relative fault planted in one layer's aten::mm is named by the default
compare and by autocompare, and nothing else is; selectors that match nothing, empty comparisons,
uninitialised memory, views under dtype_cast/fallback and conflicting settings are errors or right."""
import json
import os
import subprocess
import sys

import pytest
import torch

from ditorch_precision import AutoCompare, Capture, DtypeCast, Fallback, OverflowCheck, Selector
from ditorch_precision.cli import main
from ditorch_precision.run import main as run_main
from ditorch_precision.examples.faults import wrong_kernel
from ditorch_precision.examples.hf_llama import HFLlamaSize, hf_batches, hf_train, make_hf_llama
from ditorch_precision.metrics import ToleranceTable
from ditorch_precision.selection import SelectionError

pytest.importorskip("transformers")

SIZE = HFLlamaSize()
FAULTY = "LlamaForCausalLM.model.layers.0.mlp.down_proj"


pytestmark = pytest.mark.usefixtures("one_thread")


def _faulty_model(scale=1 + 1e-4):
    model = make_hf_llama(SIZE)
    return model, wrong_kernel("mm", scale, inside=model.model.layers[0].mlp.down_proj)


@pytest.fixture(scope="module")
def captures(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    batches = hf_batches(SIZE, 1)
    torch.set_num_threads(1)
    model = make_hf_llama(SIZE)  # built outside the capture: its initialisation is no part of the run
    with Capture(str(root / "ref")):
        hf_train(model, batches)
    model, fault = _faulty_model()
    with fault, Capture(str(root / "bad")):
        hf_train(model, batches)
    with Capture(str(root / "empty")):
        pass
    model = make_hf_llama(SIZE)
    with Capture(str(root / "no_tensors"), Selector.build(ops="mm"), save_tensors=False):
        hf_train(model, batches)
    return root


def test_the_planted_fault_is_in_that_mm_only():
    """The fault itself, against plain torch: wrong inside the module, right outside it."""
    model, fault = _faulty_model()
    x = torch.randn(3, SIZE.intermediate)
    with fault:
        inside = model.model.layers[0].mlp.down_proj(x)
        outside = x @ model.model.layers[0].mlp.down_proj.weight.t()
    plain = torch.nn.functional.linear(x.double(), model.model.layers[0].mlp.down_proj.weight.double())
    torch.testing.assert_close(inside.double(), plain * (1 + 1e-4), rtol=2e-6, atol=1e-7)
    torch.testing.assert_close(outside.double(), plain, rtol=2e-6, atol=1e-7)


def test_default_compare_names_the_planted_mm_and_nothing_else(captures, capsys):
    assert main(["compare", str(captures / "bad"), str(captures / "ref"), "--json"]) == 1
    d = json.loads(capsys.readouterr().out)
    failed = [(r["op"], r["module"], r["phase"]) for r in d["ops"] if r["status"] == "fail"]
    assert failed == [("aten::mm", FAULTY, "forward")]
    assert d["first_divergence"]["rule"] == "error_ratio" and d["n_passed"] > 500


def test_two_honest_runs_pass_by_default(captures, capsys):
    assert main(["compare", str(captures / "ref"), str(captures / "ref")]) == 0


def test_autocompare_finds_the_planted_mm_and_passes_an_honest_run():
    batches = hf_batches(SIZE, 1)
    with AutoCompare() as honest:
        hf_train(make_hf_llama(SIZE), batches)
    assert honest.failures == [] and honest.summary()["n_compared"] > 400
    model, fault = _faulty_model()
    with fault, AutoCompare() as ac:
        hf_train(model, batches)
    assert [(r["op"], r["module"], r["phase"]) for r in ac.failures] == [("aten::mm", FAULTY, "forward")]
    assert ac.failures[0]["max_rel"] == pytest.approx(1e-4, rel=0.5)


def test_tolerance_table_precedence():
    t = ToleranceTable.parse("float32=1e-4:1e-6, rsqrt=:1e-3", rtol=2e-5)
    assert t.resolve("aten::rsqrt", torch.float32) == (1e-4, 1e-3)  # op atol over the dtype's
    assert t.resolve("aten::mm", torch.float32) == (1e-4, 1e-6)
    assert t.resolve("aten::mm", torch.float16) == (2e-5, None)
    for bad in ("float32", "mm=x", "mm=-1", "mm=1:2:3"):
        with pytest.raises(ValueError, match="tolerance"):
            ToleranceTable.parse(bad)


def test_tolerances_per_op_and_dtype_on_the_command_line(captures, capsys, monkeypatch):
    bad, ref = str(captures / "bad"), str(captures / "ref")
    assert main(["compare", bad, ref, "--rule", "allclose", "--tol", "float32=1e-2:1e-2"]) == 0
    assert main(["compare", bad, ref, "--rule", "allclose", "--tol", "float32=1e-2:1e-2", "--tol", "mm=0:0"]) == 1
    monkeypatch.setenv("PRECISION_TOL", "float32=1e-2:1e-2")
    assert main(["compare", bad, ref, "--rule", "allclose"]) == 0
    capsys.readouterr()
    assert main(["compare", bad, ref, "--rule", "allclose", "--tol", "float32=0:0"]) == 2
    assert "PRECISION_TOL" in capsys.readouterr().err


def test_autocompare_tolerance_from_the_environment():
    model, fault = _faulty_model()
    with fault, AutoCompare(Selector.build(ops="mm"), tolerances=ToleranceTable.parse("aten::mm=1e-3:1e-3")) as ac:
        hf_train(model, hf_batches(SIZE, 1))
    assert ac.failures == [] and ac.summary()["n_compared"] > 10


@pytest.mark.parametrize("dump,what", [("empty", "no ops"), ("no_tensors", "skipped")])
def test_compare_of_nothing_is_exit_2(captures, capsys, dump, what):
    assert main(["compare", str(captures / dump), str(captures / dump)]) == 2
    err = capsys.readouterr().err
    assert "nothing was compared" in err and what in err


@pytest.mark.parametrize("kwargs,expect", [
    ({"modules": "layer.1"}, "model.layers.1"),
    ({"modules": "model.layers.7"}, "model.layers.1"),
    ({"steps": "5"}, "never reached"),
])
def test_a_selector_matching_nothing_is_an_error_naming_close_names(kwargs, expect):
    with pytest.raises(SelectionError, match="matched none|never reached") as err:
        with OverflowCheck(Selector.build(**kwargs)):
            hf_train(make_hf_llama(SIZE), hf_batches(SIZE, 1))
    assert expect in str(err.value)


@pytest.mark.parametrize("kwargs,expect", [({"ops": "mmm"}, "closest: mm"), ({"ops": "rsqrtt"}, "rsqrt")])
def test_an_unknown_op_is_refused_before_the_run(kwargs, expect):
    with pytest.raises(SelectionError, match="matches no operator") as err:
        OverflowCheck(Selector.build(**kwargs)).__enter__()
    assert expect in str(err.value)


def test_an_unknown_phase_is_refused():
    with pytest.raises(SelectionError, match="forward"):
        Selector.build(phases="fwd")


SCRIPT = """
import torch
from ditorch_precision.examples.hf_llama import HFLlamaSize, hf_batches, hf_train, make_hf_llama
hf_train(make_hf_llama(HFLlamaSize()), hf_batches(HFLlamaSize(), 1))
print("trained")
"""


def _run(tmp_path, *argv, **env):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("PRECISION_")}
    environ.update(PYTHONPATH=os.getcwd(), OMP_NUM_THREADS="1", **env)
    return subprocess.run([sys.executable, "-m", "ditorch_precision.run", *argv, str(script)], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path, env=environ)


def test_run_with_a_module_typo_exits_2_naming_the_closest(tmp_path):
    p = _run(tmp_path, "--tool", "overflow_check", "--modules", "layer.1")
    assert p.returncode == 2, p.stderr
    assert "'layer.1'" in p.stderr and "model.layers.1" in p.stderr and "Traceback" not in p.stderr


@pytest.mark.parametrize("argv,env,expect", [
    (["--tool", "capture", "--ops", "mm"], {"PRECISION_OPS": "silu"}, "--ops 'mm' vs PRECISION_OPS='silu'"),
    (["--tool", "capture"], {"PRECISION_TOOL": "autocompare"}, "PRECISION_TOOL"),
])
def test_flag_and_variable_that_disagree_are_exit_2_before_the_script(tmp_path, argv, env, expect, capsys,
                                                                      monkeypatch):
    # In this process: the disagreement is found before any tool starts (a traceback would be an
    # exception other than SystemExit).
    for key in [k for k in os.environ if k.startswith("PRECISION_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    with pytest.raises(SystemExit) as exit_:
        run_main([*argv, str(script)])
    out, err = capsys.readouterr()
    assert exit_.value.code == 2 and expect in err and "trained" not in out, err


def test_a_flag_that_cannot_change_tools_the_variable_started_is_exit_2(tmp_path):
    # A real process: PRECISION_TOOL starts the tools as ditorch_precision is imported.
    p = _run(tmp_path, "--modules", "model.layers.1", PRECISION_TOOL="op_timer")
    assert p.returncode == 2 and "PRECISION_MODULES" in p.stderr and "trained" not in p.stdout, p.stderr


def test_bulk_flag_on_the_run_wrapper(tmp_path):
    p = _run(tmp_path, "--tool", "capture", "--bulk", "--modules", "model.layers.1.mlp", "--out", "o")
    assert p.returncode == 0, p.stderr
    meta = json.loads((tmp_path / "o" / "capture" / "rank0" / "meta.json").read_text())
    assert meta["bulk"] is True and meta["n_records"] > 10


def test_overflow_check_ignores_uninitialised_memory():
    torch.use_deterministic_algorithms(True)
    fill = torch.utils.deterministic.fill_uninitialized_memory
    torch.utils.deterministic.fill_uninitialized_memory = True  # empty() is filled with NaN: a sure garbage
    try:
        with OverflowCheck() as oc:
            garbage = torch.empty(4)
            buf = torch.empty(2, 2)
            torch.mm(torch.ones(2, 2), torch.ones(2, 2), out=buf)  # an out= op is judged on its real inputs
            big = torch.full((2, 2), 3e38)
            torch.mm(big, big, out=buf)
    finally:
        torch.use_deterministic_algorithms(False)
        torch.utils.deterministic.fill_uninitialized_memory = fill
    assert bool(garbage.isnan().all())  # the premise: the memory did hold NaN
    assert bool(buf.isinf().all())  # plain torch: the second mm overflows
    assert [(e.op, e.kind) for e in oc.events] == [("aten::mm", "inf")]


def _views(dtype):
    x = torch.zeros(4, dtype=dtype)
    x.view(2, 2).add_(1)
    x[0] = 5
    y = x.view(2, 2)
    y.mul_(2)
    x.unsqueeze(0)[0, 3] = 7
    return x


@pytest.mark.parametrize("tool", [lambda: DtypeCast(), lambda: Fallback()])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_dtype_cast_and_fallback_keep_view_semantics(tool, dtype):
    expected = _views(dtype)
    with tool():
        got = _views(dtype)
    assert got.dtype == dtype and got.tolist() == expected.tolist() == [10.0, 2.0, 2.0, 7.0]


@pytest.mark.parametrize("key,value", [("bulk", "y"), ("sync", "of"), ("callsite", "2"), ("api", "ture")])
def test_an_on_off_setting_that_is_neither_is_refused(key, value):
    # 'y' or 'ture' used to read as "off" without a word: the tool ran, but not as asked.
    from ditorch_precision.env import make_tool

    tool = {"bulk": "capture", "sync": "autocompare"}.get(key, "op_timer")
    with pytest.raises(ValueError, match=f"PRECISION_{key.upper()}.*{value!r}.*expected"):
        make_tool(tool, {key: value})


def test_a_misspelt_precision_variable_is_refused_naming_the_closest():
    # PRECISION_OP (for PRECISION_OPS) used to be dropped: every op was selected instead of the one asked for.
    from ditorch_precision.env import config_from_env

    with pytest.raises(ValueError, match="PRECISION_OP\\b.*PRECISION_OPS"):
        config_from_env({"PRECISION_TOOL": "capture", "PRECISION_OP": "mm"})
    assert config_from_env({"PRECISION_TOOL": "capture", "PRECISION_OPS": "mm"}) == (["capture"], {"ops": "mm"})


@pytest.mark.parametrize("tol,named,closest", [("mn=0:0", "'mn'", "mm"), ("float16=0:0", "'float16'", "float32"),
                                               ("aten::rsqrtt=1e-3", "'aten::rsqrtt'", "aten::rsqrt")])
def test_a_tolerance_key_that_matches_nothing_is_exit_2(captures, capsys, monkeypatch, tol, named, closest):
    """A misspelt op (or a dtype the runs never produce) would leave the default tolerance in force."""
    bad, ref = str(captures / "bad"), str(captures / "ref")
    assert main(["compare", bad, ref, "--tol", tol]) == 2
    err = capsys.readouterr().err
    assert named in err and closest in err
    monkeypatch.setenv("PRECISION_TOL", tol)
    assert main(["compare", bad, ref]) == 2
    assert named in capsys.readouterr().err


def test_autocompare_refuses_a_tolerance_key_that_matched_no_judged_op():
    a, b = torch.randn(3, 4), torch.randn(4, 2)
    with pytest.raises(SelectionError, match=r"'mn'.*closest: .*mm"):
        with AutoCompare(tolerances=ToleranceTable.parse("mn=1e-3")):
            torch.mm(a, b)
    with AutoCompare(tolerances=ToleranceTable.parse("mm=1e-3,float32=1e-4")) as ac:  # both keys are used
        torch.mm(a, b)
    assert ac.summary()["n_compared"] == 1


def test_a_tolerance_key_that_matches_nothing_under_run_is_exit_2(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("import torch\ntorch.mm(torch.randn(3, 4), torch.randn(4, 2))\n")
    p = subprocess.run([sys.executable, "-m", "ditorch_precision.run", "--tool", "autocompare", "--tol", "mn=1e-3",
                        "--out", str(tmp_path / "out"), str(script)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "'mn'" in p.stderr and "mm" in p.stderr, p.stderr
