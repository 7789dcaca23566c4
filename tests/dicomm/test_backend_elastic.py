"""Restarts under torchelastic (issue 27, point 4): torchrun keeps its rendezvous store across
restart rounds, so the keys the previous round's ranks wrote are still there when the new round
starts. A restarted job must never meet the previous round's ranks (their token, their cards).

Real torchrun, two worker processes, one of which SIGKILLs itself on the first attempt."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

WORKER = Path(__file__).with_name("elastic_worker.py")


def test_a_torchelastic_restart_meets_only_its_own_round(tmp_path):
    out = tmp_path / "result.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DICOMM_", "TORCHELASTIC_"))}
    env.pop("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", None)  # torch's default: one store for every round
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "--max-restarts=1", "--monitor-interval=0.1", str(WORKER), str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    got = json.loads(out.read_text())
    # The reference: 2 ranks, the second attempt's values 10 * (rank + 1) + 1.
    assert got == {"attempt": 1, "world": 2, "sum": [11.0 + 21.0] * 4}
