"""The loss-curve check and `precision-diff loss`, run as a real subprocess, against hand-computed
MRE values (no device involved)."""
import json
import subprocess
import sys

import pytest

from ditorch_precision.loss import LossInputError, loss_check

REF = [2.0, 4.0, 5.0, 8.0]
RUN = [2.02, 3.9, 5.0, 8.0]
# |rel| = 0.01, 0.025, 0, 0  -> MRE 0.035 / 4
MRE = (0.01 + 0.025) / 4


def _jsonl(path, values, start=1):
    path.write_text("".join(json.dumps({"step": i, "loss": v}) + "\n" for i, v in enumerate(values, start)))
    return str(path)


def _csv(path, values, start=1):
    path.write_text("step,loss\n" + "".join(f"{i},{v!r}\n" for i, v in enumerate(values, start)))
    return str(path)


def cli(*args):
    return subprocess.run([sys.executable, "-m", "ditorch_precision.cli", "loss", *map(str, args)], capture_output=True,
                          text=True, timeout=120)


def test_known_curves_give_known_mre(tmp_path):
    r = loss_check(_jsonl(tmp_path / "run.jsonl", RUN), _csv(tmp_path / "ref.csv", REF))
    assert abs(r.mre - MRE) < 1e-9
    assert abs(r.max_rel - 0.025) < 1e-9
    assert r.n == 4 and r.passed and r.first_divergence_step == 2
    w = loss_check(RUN, REF, warmup=1)
    assert abs(w.mre - 0.025 / 3) < 1e-9 and w.n == 3
    assert not loss_check(RUN, REF, threshold=0.005).passed


def test_cli_json_fields_and_exit_codes(tmp_path):
    run, ref = _jsonl(tmp_path / "run.jsonl", RUN), _csv(tmp_path / "ref.csv", REF)
    p = cli(run, ref, "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert abs(d["mre"] - MRE) < 1e-9 and abs(d["max_rel"] - 0.025) < 1e-9
    assert d["n"] == 4 and d["passed"] is True and d["first_divergence_step"] == 2
    p = cli(run, ref, "--threshold", "0.005", "--json")
    assert p.returncode == 1 and json.loads(p.stdout)["passed"] is False
    p = cli(run, ref, "--warmup", "2", "--json")
    assert p.returncode == 0 and json.loads(p.stdout)["n"] == 2


def test_cli_writes_csv_and_html(tmp_path):
    run, ref = _jsonl(tmp_path / "run.jsonl", RUN), _jsonl(tmp_path / "ref.jsonl", REF)
    p = cli(run, ref, "--csv", tmp_path / "l.csv", "--html", tmp_path / "l.html")
    assert p.returncode == 0 and "MRE" in p.stdout
    rows = (tmp_path / "l.csv").read_text().splitlines()
    assert rows[0] == "step,loss,ref_loss,rel_error" and len(rows) == 5
    assert float(rows[2].split(",")[3]) == pytest.approx(-0.025)
    assert "<svg" in (tmp_path / "l.html").read_text()


@pytest.mark.parametrize("case, needle", [
    ("nan", "NaN"), ("empty", "empty"), ("malformed", ":2: not JSON"), ("steps", "step ranges differ"),
    ("missing", "cannot read"), ("header", "lacks 'step' and 'loss'"), ("dup", "appears twice"),
])
def test_bad_inputs_exit_2_with_a_message(tmp_path, case, needle):
    ref = _jsonl(tmp_path / "ref.jsonl", REF)
    run = tmp_path / "run.jsonl"
    if case == "nan":
        _jsonl(run, [2.0, float("nan"), 5.0, 8.0])
    elif case == "empty":
        run.write_text("\n")
    elif case == "malformed":
        run.write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": \n')
    elif case == "steps":
        _jsonl(run, RUN, start=3)
    elif case == "missing":
        run = tmp_path / "nope.jsonl"
    elif case == "header":
        run.write_text("iteration,value\n1,2.0\n")
    elif case == "dup":
        run.write_text("step,loss\n1,2.0\n1,2.1\n")
    p = cli(run, ref, "--json")
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert needle in p.stderr
    if case != "nan":
        assert str(run) in p.stderr or case == "steps"
    err = json.loads(p.stdout)
    assert needle in err["error"]
    if case == "nan":
        assert err["nan_steps"] == [2]


def test_common_steps_option(tmp_path):
    with pytest.raises(LossInputError, match="step ranges differ"):
        loss_check({1: 1.0, 2: 1.0, 3: 1.0}, {2: 1.0, 3: 1.1})
    r = loss_check({1: 1.0, 2: 1.0, 3: 1.0}, {2: 1.0, 3: 1.25}, common_steps=True)
    assert r.n == 2 and abs(r.mre - 0.1) < 1e-9 and r.first_divergence_step == 3


def test_plot_png_or_clear_missing_package_error(tmp_path):
    run, ref = _jsonl(tmp_path / "run.jsonl", RUN), _jsonl(tmp_path / "ref.jsonl", REF)
    png = tmp_path / "loss.png"
    p = cli(run, ref, "--plot", png)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert p.returncode == 2 and "matplotlib" in p.stderr
        pytest.skip("matplotlib not installed: only the error path was checked")
    assert p.returncode == 0, p.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
