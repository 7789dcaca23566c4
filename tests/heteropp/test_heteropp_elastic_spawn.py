"""A host's warm process for elastic workers (heteropp.engine.elastic_zygote) and the stand-in the agent starts
(heteropp/engine/elastic_spawn.py), as real processes: the stand-in's exit status and output are the worker's
(against the same command started the ordinary way, `python -m heteropp.engine.elastic`), a signal the agent
sends the stand-in reaches the worker and ends both, and a worker whose stand-in is killed kills itself."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from heteropp.engine import RunConfig
from heteropp.engine.elastic_launch import SPAWN
from heteropp.engine.elastic_spawn import address
from heteropp.spec import PRESETS
from heteropp.spec.io import load_mapping

REPO = Path(__file__).resolve().parents[2]


def children(pid: int) -> set[int]:
    out: set[int] = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            out |= {int(c) for c in f.read().split()}
    return out


@pytest.fixture(scope="module")
def zygote(tmp_path_factory):
    sock = str(tmp_path_factory.mktemp("zygote") / "z.sock")
    proc = subprocess.Popen([sys.executable, "-u", "-m", "heteropp.engine.elastic_zygote", sock])
    deadline = time.time() + 180
    while not os.path.exists(sock):  # it listens once torch and the worker are imported
        assert proc.poll() is None and time.time() < deadline, "the zygote did not come up"
        time.sleep(0.05)
    yield proc, sock
    proc.kill()
    proc.wait()


def stand_in(sock: str, args: list[str], **env: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(SPAWN), *args], env={**os.environ, "HETEROPP_ZYGOTE": sock, **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_the_stand_in_exits_as_the_worker_does_and_shows_its_output(zygote, tmp_path) -> None:
    _, sock = zygote
    env = {k: v for k, v in os.environ.items() if k != "HETEROPP_CHIP"}
    # no chip type given: heteropp's own message on stderr and a failing status (one ordinary start: seconds)
    for args in (["--config", str(_blocking_config(tmp_path))],):
        ordinary = subprocess.run([sys.executable, "-m", "heteropp.engine.elastic", *args], env=env,
                                  capture_output=True, text=True, timeout=300)
        p = subprocess.Popen([sys.executable, str(SPAWN), *args], env={**env, "HETEROPP_ZYGOTE": sock},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out, err = p.communicate(timeout=120)
        assert p.returncode == ordinary.returncode != 0, (args, err)
        assert ordinary.stderr.strip().splitlines()[-1] == err.strip().splitlines()[-1], (ordinary.stderr, err)


def _blocking_config(tmp: Path) -> Path:
    """A worker that waits in the control group's rendezvous (rank 1 of 2, nobody at the master's port)."""
    plan = {"version": 2, "stages": [{"chip": "big", "tp": 1, "layers": 8}], "dp": 1, "micro_batch_size": 1,
            "micro_batches": 2}
    cfg = RunConfig(plan=plan, model=RunConfig.model_dict(PRESETS["tiny"]), backend="gloo", timeout_s=120,
                    options={"checkpoint_dir": str(tmp / "ck")})
    path = tmp / "run.json"
    path.write_text(json.dumps({**cfg.__dict__, "elastic": {
        "cluster": load_mapping(str(REPO / "examples/clusters/two-cpu.yaml")),
        "train": {"global_batch": 2, "micro_batch_size": 1}}}))
    return path


def _worker_of(zpid: int, before: set[int]) -> int:
    deadline = time.time() + 60
    while not (new := children(zpid) - before):
        assert time.time() < deadline, "the zygote forked no worker"
        time.sleep(0.02)
    return new.pop()


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.parametrize("how", ["sigterm the stand-in", "sigkill the stand-in", "sigkill the worker"])
def test_the_agents_signal_reaches_the_worker_and_a_dead_stand_in_takes_it_along(zygote, tmp_path, how) -> None:
    zp, sock = zygote
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nobody listens there
    env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "LOCAL_RANK": "1"}
    before = children(zp.pid)
    p = stand_in(sock, ["--config", str(_blocking_config(tmp_path)), "--chip", "big"], **env)
    worker = _worker_of(zp.pid, before)
    time.sleep(0.5)
    assert p.poll() is None and not _gone(worker), "the worker did not wait for its peers"
    if how == "sigterm the stand-in":
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=60)
        assert p.returncode == -signal.SIGTERM  # the worker died of it, and so did its stand-in
    elif how == "sigkill the worker":  # the kernel's kill (out of memory, a user): the agent sees the same death
        os.kill(worker, signal.SIGKILL)
        _, err = p.communicate(timeout=60)
        assert p.returncode == -signal.SIGKILL and "Traceback" not in err, (p.returncode, err)
    else:
        p.kill()
        p.wait(timeout=60)
    deadline = time.time() + 60
    while not _gone(worker):
        assert time.time() < deadline, f"the worker {worker} outlived its stand-in ({how})"
        time.sleep(0.05)


KEEPER = REPO / "heteropp/engine/snapshot_keeper.py"


def _listening(name: str) -> bool:
    """Whether an abstract unix socket @name is bound (the kernel lists those in /proc/net/unix)."""
    with open("/proc/net/unix") as f:
        return any(line.split()[-1] == name for line in f.read().splitlines()[1:] if len(line.split()) > 7)


def _ask_as(uid: int, name: str) -> str:
    """The zygote's first reply to a request sent by a process of another user (a forked child that drops to uid)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # stdlib only from here on: connect as uid, send a well-formed request with three descriptors
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
                c.settimeout(30)
                c.connect(address(name))
                try:
                    socket.send_fds(c, [json.dumps({"argv": ["--help"], "env": {}, "cwd": "/"}).encode() + b"\n"],
                                    [0, 1, 2])
                except (BrokenPipeError, ConnectionResetError):
                    pass  # refused before it read the request: its reply is still there to read
                reply = c.recv(4096)
            os.write(w, reply or b"(closed without a reply)")
        except BaseException as e:  # noqa: BLE001  reported to the parent, which asserts on it
            os.write(w, f"child failed: {e!r}".encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        out = f.read().decode()
    os.waitpid(pid, 0)
    return out


@pytest.mark.skipif(os.getuid() != 0, reason="connecting as another user needs root (setuid)")
def test_a_hosts_zygote_serves_only_its_user_and_a_killed_host_leaves_no_file(tmp_path) -> None:
    """The keeper's zygote listens on an abstract socket name: a request from another uid is refused (it would run
    a worker with the requester's arguments), and SIGKILLing the host (keeper, agent, zygote) leaves nothing in
    the temporary directory and no socket bound."""
    tmp, where = tmp_path / "tmp", tmp_path / "zygote.name"
    tmp.mkdir()
    child = f"import os, time; open({str(where)!r}, 'w').write(os.environ['HETEROPP_ZYGOTE']); time.sleep(600)"
    proc = subprocess.Popen([sys.executable, str(KEEPER), "--listen", "127.0.0.1:0", "--", sys.executable, "-c",
                             child], env={**os.environ, "TMPDIR": str(tmp)}, start_new_session=True)
    try:
        deadline = time.time() + 180
        while not (where.exists() and where.read_text()):
            assert proc.poll() is None and time.time() < deadline, "the keeper did not start its child"
            time.sleep(0.05)
        name = where.read_text()
        assert name.startswith("@heteropp-zygote-"), f"the zygote's socket is a file: {name}"
        while not _listening(name):  # it binds once torch is imported
            assert proc.poll() is None and time.time() < deadline, "the zygote did not come up"
            time.sleep(0.05)
        reply = _ask_as(65534, name)
        assert "refused" in reply and "uid 65534" in reply and "pid" not in reply, reply
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert not list(tmp.iterdir()), f"the killed host left {sorted(p.name for p in tmp.iterdir())}"
    deadline = time.time() + 30
    while _listening(name):  # the zygote is gone with its host: nothing bound under its name
        assert time.time() < deadline, f"{name} is still bound after its host was killed"
        time.sleep(0.05)


def _squat_as(uid: int, name: str) -> tuple[int, int]:
    """A process of another user that binds the abstract socket @name first and reports, on the pipe it
    returns (with its pid), how many bytes the one connection it accepts sent it (-1: no connection)."""
    r, w = os.pipe()
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        got = -1
        try:
            os.close(r)
            os.close(ready_r)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.bind(address(name))
                s.listen(1)
                os.write(ready_w, b"1")
                s.settimeout(60)
                c, _ = s.accept()
                c.settimeout(5)
                got = 0
                try:
                    while chunk := c.recv(65536):
                        got += len(chunk)
                except OSError:
                    pass
        finally:
            os.write(w, str(got).encode())
            os._exit(0)
    os.close(w)
    os.close(ready_w)
    assert os.read(ready_r, 1) == b"1", "the other user's process did not bind the name"
    os.close(ready_r)
    return pid, r


@pytest.mark.skipif(os.getuid() != 0, reason="a socket of another user needs root (setuid)")
def test_a_stand_in_whose_zygote_name_another_user_holds_starts_the_worker_itself(tmp_path) -> None:
    """The name in HETEROPP_ZYGOTE is one anyone on the host could bind first: the stand-in sends the worker's
    arguments and environment only to a zygote of its own uid, and otherwise starts the worker the ordinary way
    (the same status and message as `python -m heteropp.engine.elastic`), saying why."""
    name = f"@heteropp-zygote-test-{os.getpid()}"
    env = {k: v for k, v in os.environ.items() if k != "HETEROPP_CHIP"}
    args = ["--config", str(_blocking_config(tmp_path))]
    ordinary = subprocess.run([sys.executable, "-m", "heteropp.engine.elastic", *args], env=env,
                              capture_output=True, text=True, timeout=300)
    squatter, report = _squat_as(65534, name)
    try:
        p = subprocess.run([sys.executable, str(SPAWN), *args], env={**env, "HETEROPP_ZYGOTE": name},
                           capture_output=True, text=True, timeout=300)
    finally:
        with os.fdopen(report, "rb") as f:
            got = int(f.read() or b"-2")
        os.waitpid(squatter, 0)
    assert got == 0, f"the other user's socket received {got} bytes (-1: no connection)"
    assert p.returncode == ordinary.returncode != 0, p.stderr
    assert f"{name} is held by uid 65534" in p.stderr, p.stderr
    assert ordinary.stderr.strip().splitlines()[-1] == p.stderr.strip().splitlines()[-1], (ordinary.stderr, p.stderr)
