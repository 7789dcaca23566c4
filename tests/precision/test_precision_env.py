"""Tools switched on for an unmodified script: PRECISION_TOOL read at `import ditorch_precision` with
`python -m ditorch_precision.run` in a real process, and the `--tool` flag (the CPU stands in for the device)."""
import json
import os
import subprocess
import sys
import textwrap

import torch

from ditorch_precision import env, run

SCRIPT = textwrap.dedent("""
    import sys
    import torch
    x = torch.full((4,), 3e38)
    y = x * float(sys.argv[1])  # overflows float32 when the factor is > 1.2
    a = torch.ones(3, 3)
    (a @ a).sum()
    print("done", sys.argv[1:])
""")


def test_environment_variables_drive_the_run_wrapper(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    environ = {**os.environ, "PYTHONPATH": os.getcwd(), "PRECISION_TOOL": "op_timer,overflow_check",
               "PRECISION_OUT": str(tmp_path / "out"), "PRECISION_EXCLUDE_OPS": "full"}
    p = subprocess.run([sys.executable, "-m", "ditorch_precision.run", str(script), "2.0"], capture_output=True,
                       text=True,
                       timeout=300, cwd=tmp_path, env=environ)
    assert p.returncode == 0, p.stderr
    assert "done ['2.0']" in p.stdout
    report = json.loads((tmp_path / "out" / "overflow_rank0.json").read_text())
    assert report["first"]["op"] == "aten::mul" and report["first"]["kind"] == "inf"
    assert any("train.py" in frame for frame in report["first"]["stack"])
    timer = json.loads((tmp_path / "out" / "op_timer_rank0.json").read_text())
    assert sorted(e["op"] for e in timer["ops"]) == ["aten::mm", "aten::mul", "aten::ones", "aten::sum"]
    assert "op_timer:" in p.stderr and "overflow_check:" in p.stderr


def test_tool_flag_runs_a_script_and_restores_torch(tmp_path, capsys):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    before = torch._C._len_torch_dispatch_stack()
    code = run.main(["--tool", "autocompare", "--ops", "mm,sum", "--out", str(tmp_path / "o"), str(script), "0.5"])
    assert code == 0 and not env._active
    assert torch._C._len_torch_dispatch_stack() == before
    rows = [json.loads(line) for line in open(tmp_path / "o" / "autocompare_rank0.jsonl")]
    assert [(r["op"], r["status"]) for r in rows] == [("aten::mm", "pass"), ("aten::sum", "pass")]
    assert "autocompare: 2 ops compared, 0 failed" in capsys.readouterr().err


def test_capture_writes_part_files_by_default_and_per_op_files_on_request(tmp_path):
    """The default capture format is the bulk one (a part file per step: a file per op cost most of
    a per-op capture); --no-bulk (PRECISION_BULK=0) keeps one file per op. Both hold the same
    tensors (reference: the two formats read back, and torch's own result)."""
    from ditorch_precision import Capture, Dump

    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    for name, flags in (("default", []), ("per_op", ["--no-bulk"])):
        assert run.main(["--tool", "capture", "--out", str(tmp_path / name), *flags, str(script), "0.5"]) == 0
    default, per_op = (Dump.open(str(tmp_path / name / "capture" / "rank0")) for name in ("default", "per_op"))
    assert default.meta["bulk"] is True and per_op.meta["bulk"] is False
    assert {f.split(".")[-1] for f in os.listdir(os.path.join(default.path, "tensors"))} == {"bin"}
    assert all(f.endswith(".pt") for f in os.listdir(os.path.join(per_op.path, "tensors")))
    mm = [next(r for r in d.records if r["op"] == "aten::mm") for d in (default, per_op)]
    outs = [d.load(r)["outputs"] for d, r in zip((default, per_op), mm)]
    torch.testing.assert_close(outs[0], torch.full((3, 3), 3.0), rtol=0, atol=0)
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)
    with Capture(str(tmp_path / "api")):
        torch.ones(2) * 2
    assert Dump.open(str(tmp_path / "api")).meta["bulk"] is True
