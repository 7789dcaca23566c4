"""The gloo job examples' group context (ditorch_precision.examples.gloo_job.joined) leaves the group
also when its body raises, so the process can report and exit instead of holding it; their launcher
(gloo_job.start) runs each rank in its own process and raises a rank's error. Run in fresh
interpreters: a process group is process state."""
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PROGRAM = textwrap.dedent("""
    import datetime, os
    import torch.distributed as dist
    from ditorch_precision.examples.gloo_job import joined
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=60))
    os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "True"  # the rank joins the store served above
    try:
        with joined(0, 1, store.port):
            assert dist.is_initialized()
            raise ValueError("the body failed")
    except ValueError as e:
        print("raised:", e)
    print("initialised after:", dist.is_initialized())
""")


def test_a_body_that_raises_leaves_the_group_and_the_error_goes_on():
    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "raised: the body failed" in done.stdout
    assert "initialised after: False" in done.stdout, done.stdout


RANKS_PROGRAM = Path(__file__).with_name("gloo_start_ranks.py")
MODULE, FILE = ("-m", RANKS_PROGRAM.stem), (str(RANKS_PROGRAM),)


def _start(tmp_path, how: tuple, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *how, str(tmp_path), *args], capture_output=True, text=True, timeout=120,
                          cwd=RANKS_PROGRAM.parent)


# The default (forkserver) run with -m and as a file (its __main__ has no module name to preload), and
# fork, which the precision tests pass to the examples (conftest.FORK).
@pytest.mark.parametrize("how, method", [(MODULE, "forkserver"), (FILE, "forkserver"), (MODULE, "fork")],
                         ids=["module-forkserver", "file-forkserver", "module-fork"])
def test_start_runs_each_rank_in_its_own_process(tmp_path, how, method):
    done = _start(tmp_path, how, "--start-method", method)
    assert done.returncode == 0, done.stderr[-3000:]
    launcher = int(done.stdout.split("launcher ")[1])
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["rank"] for r in ranks] == [0, 1]
    pids = {r["pid"] for r in ranks}
    assert len(pids) == 2 and launcher not in pids


def test_start_raises_a_ranks_error_in_the_launcher(tmp_path):
    done = _start(tmp_path, MODULE, "--fail")
    assert done.returncode != 0
    assert "ValueError: rank 1 failed on purpose" in done.stderr, done.stderr[-3000:]
    assert "launcher" not in done.stdout  # start raised: the launcher went no further
