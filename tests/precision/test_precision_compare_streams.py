"""compare streams: it reads the captures' index records a step at a time and hands each row to the
caller (``on_row``) instead of holding them, so its memory does not grow with the number of ops.

The captures: a real stats capture of two training steps of a small model, repeated as
``LONG`` steps (its records copied with their step and call index shifted: the ops of a long run
of the same loop). Measured through the peak resident memory of a process that only runs the
compare (VmHWM), the long pair against the two-step one; the bound is a fraction of the index bytes
the long captures add, not anything the compare itself reports."""
import json
import os
import subprocess
import sys

import pytest
import torch

from ditorch_precision import Capture

LONG = 250  # repeats of the two captured steps


def _two_steps(path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 16)
    with Capture(str(path), mode="stats"):
        for _ in range(2):
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()


def _repeat(src, dst, times: int, fault_at: int | None = None) -> tuple[int, int | None]:
    """``src``'s two steps written ``times`` times into ``dst``; returns (op records, index of the
    op whose first output's max is changed by 1e-3 relative in repeat ``fault_at``). The model's state
    record (its weights before its first op) is a run's once, as in a real run: in the first repeat."""
    with open(os.path.join(src, "meta.json")) as f:
        meta = json.load(f)
    with open(os.path.join(src, "index.jsonl")) as f:
        records = [json.loads(line) for line in f]
    steps, span = 2, meta["n_ops_seen"]
    os.makedirs(dst)
    faulty = None
    with open(os.path.join(dst, "index.jsonl"), "w") as f:
        for k in range(times):
            for rec in records:
                if k and rec["op"] == "module::state":
                    continue
                rec = {**rec, "step": rec["step"] + k * steps, "index": rec["index"] + k * span}
                if k == fault_at and faulty is None and rec.get("kind", "op") == "op" and rec["op"] == "aten::addmm":
                    stats = [dict(s) for s in rec["stats"]]
                    stats[0]["max"] *= 1 + 1e-3
                    rec["stats"], faulty = stats, rec["index"]
                f.write(json.dumps(rec) + "\n")
    with open(os.path.join(dst, "meta.json"), "w") as f:
        json.dump({**meta, "n_records": len(records) * times, "n_ops_seen": span * times}, f)
    states = sum(r["op"] == "module::state" for r in records)
    assert states == 1, states
    return sum(r.get("kind", "op") == "op" for r in records) * times + states, faulty


_CHILD = """
import csv, sys, torch
torch.set_num_threads(1)
from ditorch_precision import compare_dumps
from ditorch_precision.cli import main
if sys.argv[3] == "api":
    seen = {"op": 0, "unmatched": 0, "region": 0}
    def on_row(kind, row):
        seen[kind] += 1
    report = compare_dumps(sys.argv[1], sys.argv[2], on_row=on_row)
    d, first = report.to_dict(), report.first_divergence
    print(seen["op"], d["n_ops"], d["n_failed"], first and first["index"], end=" ")
else:  # precision-diff compare A B --csv FILE: its table written row by row
    rc = main(["compare", sys.argv[1], sys.argv[2], "--csv", sys.argv[3]])
    n, failed = 0, []
    with open(sys.argv[3]) as f:
        for r in csv.DictReader(f):  # counted, not held: the peak is the compare's
            n += 1
            if r["status"] == "fail":
                failed.append(int(r["index"]))
    print(n, rc, len(failed), failed[0] if failed else None, end=" ")
print(next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmHWM:")))
"""


def _compare(a, b, how: str = "api") -> tuple[int, int, int, int | None, int]:
    """api: (rows handed over, ops counted, failed, first divergence, peak bytes); a CSV path: the
    CLI's (CSV rows, exit status, failed rows, first of them, peak bytes)."""
    out = subprocess.run([sys.executable, "-c", _CHILD, str(a), str(b), how], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    rows, n_ops, n_failed, first, peak = out.stdout.split()[-5:]  # after what the CLI prints
    return int(rows), int(n_ops), int(n_failed), None if first == "None" else int(first), int(peak)


@pytest.mark.slow
def test_compare_memory_does_not_grow_with_the_number_of_ops(tmp_path, one_thread):
    for run in "ab":
        _two_steps(tmp_path / run)
    n_short, _ = _repeat(tmp_path / "a", tmp_path / "a1", 1)
    _repeat(tmp_path / "b", tmp_path / "b1", 1)
    n_long, faulty = _repeat(tmp_path / "a", tmp_path / "aL", LONG, fault_at=LONG - 3)
    _repeat(tmp_path / "b", tmp_path / "bL", LONG)
    index_bytes = os.path.getsize(tmp_path / "aL" / "index.jsonl") + os.path.getsize(tmp_path / "bL" / "index.jsonl")
    assert n_long - 1 == LONG * (n_short - 1) and index_bytes > 20 * 2**20

    rows, n_ops, n_failed, first, short_peak = _compare(tmp_path / "a1", tmp_path / "b1")
    assert rows == n_ops > 0 and n_failed == 0 and first is None  # the honest pair passes
    rows, n_ops, n_failed, first, long_peak = _compare(tmp_path / "aL", tmp_path / "bL")
    # every op was judged and handed over, and the one changed statistic late in the run is found
    assert rows == n_ops == n_long and n_failed == 1 and first == faulty
    assert long_peak - short_peak < index_bytes / 8, (short_peak, long_peak, index_bytes)
    rows, status, n_failed, first, cli_peak = _compare(tmp_path / "aL", tmp_path / "bL", str(tmp_path / "long.csv"))
    assert rows == n_long and status == 1 and n_failed == 1 and first == faulty
    assert cli_peak - short_peak < index_bytes / 8, (short_peak, cli_peak, index_bytes)


def test_steps_set_by_hand_out_of_order_are_compared_whole(tmp_path):
    """A loop that sets the step by hand may number its records out of order (here 0, 1, 0): such a
    capture is read whole, and its records still pair by (step, phase, module). The planted change
    (one op's max, in the second "step 0") is found there."""
    from ditorch_precision import compare_dumps
    from ditorch_precision.dump import Dump

    for run in "ab":
        torch.manual_seed(0)
        x = torch.randn(32, 8)
        with Capture(str(tmp_path / run), mode="stats") as cap:
            for step in (0, 1, 0):
                cap.step(step)
                torch.tanh(x @ x.t()).sum()
    assert not Dump.open(str(tmp_path / "a")).in_step_order
    lines = (tmp_path / "a" / "index.jsonl").read_text().splitlines()
    mms = [i for i, line in enumerate(lines) if json.loads(line)["op"] == "aten::mm"]
    rec = json.loads(lines[mms[-1]])
    assert rec["step"] == 0
    rec["stats"][0]["max"] *= 1 + 1e-3
    lines[mms[-1]] = json.dumps(rec)
    (tmp_path / "a" / "index.jsonl").write_text("\n".join(lines) + "\n")
    report = compare_dumps(str(tmp_path / "a"), str(tmp_path / "b"), on_row=lambda kind, row: None)
    assert [(r["op"], r["index"]) for r in report.failed] == [("aten::mm", rec["index"])]
    assert report.to_dict()["n_ops"] == sum(json.loads(line).get("kind", "op") == "op" for line in lines)
