import datetime
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

# The examples' ranks forked from their launcher (python -m EXAMPLE, which has only parsed its command
# line), not from a forkserver: one import of torch a job instead of two, each seconds of CPU.
FORK = ("--start-method", "fork")


@pytest.fixture
def one_thread():
    # Python dispatch modes and intra-op threads contend on a small shared machine.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def gloo_job(tmp_path_factory) -> dict:
    """One real 2-process gloo job (loopback only) for every distributed test: the collectives example
    (into "collectives"), then the Llama example honest (into "ref") and with a fault on rank 1 (into
    "fault"). One launch instead of two: each costs seconds of process start-up. Alongside it, a
    3-process job of a two-rank subgroup (into "subgroup"), so their start-ups overlap."""
    root = tmp_path_factory.mktemp("gloo")
    # Each job's store is served from here, on a port this process holds throughout: a free port
    # picked here and bound by the job's rank 0 seconds later (after its imports) could be taken in
    # between by any socket of this host. With TORCHELASTIC_USE_AGENT_STORE, torch's tcp:// rendezvous
    # makes every rank a client of the store at that address (as under torchrun's agent).
    stores = [dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                            timeout=datetime.timedelta(seconds=300)) for _ in range(2)]
    port, subgroup_port = (s.port for s in stores)
    env = {**os.environ, "TORCHELASTIC_USE_AGENT_STORE": "True"}
    subgroup = subprocess.Popen([sys.executable, "-m", "ditorch_precision.examples.dist_collectives",
                                 str(root / "subgroup"), "3", str(subgroup_port), "--subgroup", *FORK],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    try:
        p = subprocess.run([sys.executable, "-m", "ditorch_precision.examples.dist_llama", str(root / "fault"), "2",
                            str(port), "--fault-rank", "1", "--honest", str(root / "ref"),
                            "--collectives", str(root / "collectives"), *FORK], capture_output=True, text=True,
                           timeout=300, env=env)
        _, subgroup_err = subgroup.communicate(timeout=300)
    finally:
        if subgroup.poll() is None:
            subgroup.kill()
            subgroup.wait()
    assert p.returncode == 0, p.stderr[-3000:]  # a send/recv under the tools used to hang here
    assert subgroup.returncode == 0, subgroup_err[-3000:]
    return {name: root / name for name in ("collectives", "ref", "fault", "subgroup")}


@pytest.fixture(scope="session")
def launch_gloo():
    """Runs ``python -m MODULE ROOT WORLD PORT *ARGS`` (an example that starts a real gloo job, its ranks
    forked from it: FORK, unless ``fork`` is false for an example whose launcher runs operators first), its
    store served from this process (see gloo_job), and asserts it succeeded."""
    def launch(module: str, root, world: int, *args: str, fork: bool = True) -> None:
        store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                              timeout=datetime.timedelta(seconds=300))
        env = {**os.environ, "TORCHELASTIC_USE_AGENT_STORE": "True"}
        start = FORK if fork else ()
        p = subprocess.run([sys.executable, "-m", module, str(root), str(world), str(store.port), *start, *args],
                           capture_output=True, text=True, timeout=600, env=env)
        assert p.returncode == 0, p.stderr[-3000:]

    return launch
