"""Capture directories and command lines are untrusted input: captures are never unpickled, files
outside the capture directory are refused, and every bad argument of `precision-diff` and
`python -m ditorch_precision.run` ends with a clear message and exit status 2 (a missing script and a bad
variable at import in real processes)."""
import json
import os
import subprocess
import sys

import pytest
import torch

from ditorch_precision import Capture
from ditorch_precision.cli import main
from ditorch_precision.run import main as run_main

LOSS = '{"step": 0, "loss": 2.0}\n{"step": 1, "loss": 1.5}\n'


class Planted:
    """An object whose unpickling creates a directory: proof that a loader ran code from a file."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def run(*args, cwd=None):
    p = subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, timeout=120, cwd=cwd,
                       env={**os.environ, "PYTHONPATH": os.getcwd()})
    return p


def diff(*args):
    return run("-m", "ditorch_precision.cli", *args)


@pytest.fixture(scope="module")
def capture(tmp_path_factory):
    root = tmp_path_factory.mktemp("cap")
    a = torch.arange(6.0).reshape(2, 3)
    with Capture(str(root / "ref"), bulk=False):  # per-op files: the references some tests forge
        (a @ a.t()).sum()
    with Capture(str(root / "run"), bulk=False):
        (a @ a.t()).sum()
    (root / "loss.jsonl").write_text(LOSS)
    return root


def _clone(src, dst, edit):
    """A copy of capture ``src`` whose index records pass through ``edit``."""
    import shutil

    shutil.copytree(src, dst)
    recs = [json.loads(line) for line in open(dst / "index.jsonl")]
    (dst / "index.jsonl").write_text("".join(json.dumps(edit(r)) + "\n" for r in recs))
    return dst


def test_a_tensor_file_holding_code_is_refused_and_not_run(capture, tmp_path):
    bad = _clone(capture / "run", tmp_path / "bad", lambda r: r)
    marker = tmp_path / "code_ran"
    first = json.loads(open(bad / "index.jsonl").readline())
    torch.save({"args": [Planted(str(marker))], "kwargs": {}, "outputs": torch.ones(2)}, bad / first["file"])
    p = diff("compare", bad, capture / "ref")
    assert p.returncode == 2, p.stderr
    assert not marker.exists()
    assert "weights_only" in p.stderr and first["file"].split("/")[-1] in p.stderr
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize("where", ["../../outside.pt", "/etc/hostname", "tensors/../../x.pt"])
def test_a_file_outside_the_capture_directory_is_refused(capture, tmp_path, where, capsys):
    torch.save({"args": [], "kwargs": {}, "outputs": torch.ones(2)}, tmp_path / "outside.pt")
    bad = _clone(capture / "run", tmp_path / "sub" / "bad", lambda r: {**r, "file": where} if r.get("file") else r)
    assert main(["compare", str(bad), str(capture / "ref")]) == 2
    assert "outside the capture directory" in capsys.readouterr().err
    assert main(["replay", str(bad), "0"]) == 2
    assert "outside the capture directory" in capsys.readouterr().err


@pytest.mark.parametrize("field,value,expect", [("index", "0", "field 'index'"), ("op", 3, "field 'op'"),
                                                ("file", 7, "field 'file'"), ("step", 1.5, "field 'step'"),
                                                ("refs", [5], "field 'refs'"), ("named", [5], "field 'named'"),
                                                ("group", 5, "field 'group'")])
def test_a_bad_index_field_is_named_with_its_line(capture, tmp_path, field, value, expect, capsys):
    bad = _clone(capture / "run", tmp_path / "bad", lambda r: {**r, field: value})
    assert main(["compare", str(bad), str(capture / "ref")]) == 2
    assert f"index.jsonl:1: {expect}" in capsys.readouterr().err


def _cases(cap):
    ref, run_, loss = cap / "ref", cap / "run", cap / "loss.jsonl"
    return {
        "replay bad device": (["replay", ref, 0, "--device", "nodevice"], "--device"),
        "replay bad dtype": (["replay", ref, 0, "--dtype", "float99"], "--dtype"),
        "replay non-float dtype": (["replay", ref, 0, "--dtype", "int32"], "--dtype"),
        "replay non-numeric index": (["replay", ref, "x"], "op_index"),
        "compare csv is a directory": (["compare", run_, ref, "--csv", cap], "--csv"),
        "compare html in a missing directory": (["compare", run_, ref, "--html", cap / "no" / "d.html"], "--html"),
        "loss plot is a directory": (["loss", loss, loss, "--plot", cap], "--plot"),
        "loss csv is a directory": (["loss", loss, loss, "--csv", cap], "--csv"),
        "non-numeric rtol": (["compare", run_, ref, "--rtol", "abc"], "--rtol"),
        "negative rtol": (["compare", run_, ref, "--rtol", "-1"], "--rtol"),
        "negative atol": (["compare", run_, ref, "--atol", "-1e-3"], "--atol"),
        "negative error ratio": (["compare", run_, ref, "--error-ratio", "-2"], "--error-ratio"),
        "nan rtol": (["compare", run_, ref, "--rtol", "nan"], "--rtol"),
        "negative rows": (["compare", run_, ref, "--rows", "-1"], "--rows"),
        "negative threshold": (["loss", loss, loss, "--threshold", "-0.1"], "--threshold"),
        "negative warmup": (["loss", loss, loss, "--warmup", "-1"], "--warmup"),
    }


@pytest.mark.parametrize("case", list(_cases(__import__("pathlib").Path("."))))
def test_every_bad_cli_argument_is_exit_2_with_a_message(capture, case, capsys):
    argv, names = _cases(capture)[case]
    with pytest.raises(SystemExit) as exit_:  # argparse's usage error, in this process
        main([str(a) for a in argv])
    assert exit_.value.code == 2
    assert names in capsys.readouterr().err


@pytest.mark.parametrize("argv,names", [
    (["--tool", "nosuchtool"], "nosuchtool"),
    (["--tool", "capture", "--max-bytes", "lots"], "--max-bytes"),
    (["--tool", "capture", "--max-bytes", "-5"], "--max-bytes"),
    (["--tool", "op_timer", "--top", "x"], "--top"),
    (["--tool", "capture", "--steps", "1-x"], "--steps"),
    (["--tool", "dtype_cast", "--dtype", "float99"], "--dtype"),
    (["--tool", "overflow_check", "--range-dtype", "int8"], "--range-dtype"),
    (["--tool", "fallback", "--device", "nodevice"], "--device"),
])
def test_every_bad_run_argument_is_exit_2_with_a_message(tmp_path, argv, names, capsys, monkeypatch):
    # In this process (argparse's usage error, as for precision-diff above): a traceback would be an
    # exception other than SystemExit. The real process start is covered by the tests below.
    for key in [k for k in os.environ if k.startswith("PRECISION_")]:
        monkeypatch.delenv(key)
    script = tmp_path / "train.py"
    script.write_text("print('the script ran')\n")
    with pytest.raises(SystemExit) as exit_:
        run_main([*argv, str(script)])
    assert exit_.value.code == 2
    out, err = capsys.readouterr()
    assert names in err and "the script ran" not in out, (out, err)


def test_a_bad_variable_at_import_is_exit_2(tmp_path):
    p = subprocess.run([sys.executable, "-c", "import ditorch_precision; print('the script ran')"], capture_output=True,
                       text=True, timeout=120, cwd=tmp_path, env={**os.environ, "PYTHONPATH": os.getcwd(),
                                                                  "PRECISION_TOOL": "capture", "PRECISION_STEPS": "x"})
    assert p.returncode == 2 and "PRECISION_STEPS" in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert "the script ran" not in p.stdout


def test_a_missing_script_is_exit_2(tmp_path):
    p = run("-m", "ditorch_precision.run", "--tool", "op_timer", tmp_path / "missing.py", cwd=tmp_path)
    assert p.returncode == 2 and "missing.py" in p.stderr and "Traceback" not in p.stderr, p.stderr


@pytest.mark.parametrize("view,expect", [([[1000], [1], 0], "reaches element 999"), ([[2], [-1], 3], "negative"),
                                         ([[2], [1]], "bad view"), ([["2"], [1], 0], "bad view")])
def test_a_view_reference_outside_its_storage_is_refused(capture, tmp_path, view, expect, capsys):
    first = json.loads(open(capture / "run" / "index.jsonl").readline())["file"]
    ref = {"__precision__": "ref", "file": first, "tensor": 0, "view": view}
    bad = _clone(capture / "run", tmp_path / "bad", lambda r: {**r, "file": None, "named": {
        "args": [ref], "kwargs": {}, "outputs": ref}})
    assert main(["compare", str(bad), str(capture / "ref")]) == 2
    assert expect in capsys.readouterr().err


def test_a_bad_transfer_record_is_named_with_its_line(capture, tmp_path, capsys):
    import shutil

    for run_ in ("bad", "good"):
        for r in (0, 1):
            shutil.copytree(capture / "run", tmp_path / run_ / f"rank{r}")
    (tmp_path / "bad" / "rank1" / "transfers.jsonl").write_text('{"op": "c10d::send", "tag": "x", "index": 1}\n')
    assert main(["compare", str(tmp_path / "bad"), str(tmp_path / "good")]) == 2
    err = capsys.readouterr().err
    assert "transfers.jsonl:1" in err and "'tag'" in err


def test_a_capture_without_its_meta_json_is_refused(capture, tmp_path, capsys):
    """meta.json is written when a capture ends: without it the run stopped early or the copy is
    incomplete (before: accepted, exit 0)."""
    import shutil

    shutil.copytree(capture / "run", tmp_path / "run")
    (tmp_path / "run" / "meta.json").unlink()
    assert main(["compare", str(tmp_path / "run"), str(capture / "ref")]) == 2
    err = capsys.readouterr().err
    assert "meta.json" in err and str(tmp_path / "run") in err
    assert main(["replay", str(tmp_path / "run"), "0"]) == 2


def test_replay_takes_the_unified_device_name(capture, capsys):
    """--device device is ditorch's device (the CPU on a host without accelerators); before:
    "'device' is not a device"."""
    imported = "ditorch" in sys.modules
    try:
        assert main(["replay", str(capture / "run"), "0", "--device", "device", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["device"] == str(sys.modules["ditorch"].device_obj())
    finally:
        if not imported:  # importing it switched the name on for this whole process: off again
            sys.modules["ditorch"].disable()
    with pytest.raises(SystemExit) as exit_:  # argparse's usage error, in this process
        main(["replay", str(capture / "run"), "0", "--device", "device:x"])
    assert exit_.value.code == 2 and "device:<index>" in capsys.readouterr().err
