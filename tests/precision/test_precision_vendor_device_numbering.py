"""Op numbering on a vendor device whose library lacks kernels that CPU and CUDA have: the diopi device
(PrivateUse1, this project's DIOPI reference library). There torch runs such an op's composite kernel at
the autograd key (silu_backward), so a dispatch mode is shown its parts; both capture hooks number the ops
the test's own dispatch mode is shown (tests/precision/program_ops.OpLog, the independent reference).
The device registers itself once per process: the program runs in a fresh interpreter."""
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ditorch_precision import native

HERE = Path(__file__).resolve().parent
PROGRAM = textwrap.dedent("""
    import json, sys, tempfile
    import torch
    sys.path.insert(0, {here!r})
    from program_ops import OpLog
    from ditorch_precision import Capture
    from ditorch_precision.dump import Dump
    if {device!r} == "diopi":
        from diopi_bindings import device
        device.enable()

    def program():
        torch.manual_seed(0)
        lin = torch.nn.Linear(8, 8).to({device!r})
        x = torch.randn(4, 8).to({device!r}).requires_grad_()
        torch.nn.functional.silu(lin(x)).sum().backward()

    program()  # once before: lazy initialisations stay out of the sequences
    with OpLog() as log:
        program()
    seqs = {{"reference": log.ops}}
    for hook in ("python", "cpp"):
        d = tempfile.mkdtemp()
        with Capture(d, mode="stats", hook=hook):
            program()
        seqs[hook] = [r["op"] for r in Dump.open(d).op_records]
    print(json.dumps(seqs))
""")


def _sequences(device: str) -> dict:
    done = subprocess.run([sys.executable, "-c", PROGRAM.format(here=str(HERE), device=device)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not native.available(), reason="the C++ module is not built")
@pytest.mark.parametrize("device", ["cpu", "diopi"])
def test_both_hooks_number_the_ops_a_dispatch_mode_is_shown(device):
    seqs = _sequences(device)
    assert seqs["python"] == seqs["reference"]
    assert seqs["cpp"] == seqs["reference"]
    # CPU has a silu_backward kernel; the reference library does not: decomposed there
    assert ("aten::silu_backward" in seqs["reference"]) == (device == "cpu"), seqs["reference"]
