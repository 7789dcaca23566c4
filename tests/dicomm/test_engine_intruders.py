"""Nobody outside the job joins it. A hostile client (tests/dicomm/intruder.py) that read the job's
token and address cards from the store claims to be rank 0 and injects a message into rank 1's
pending receive. It runs as a separate process: of the same user, or of an unprivileged user the
test creates. Real communicators in real processes on one host, real Unix and TCP sockets."""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import pwd
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.dicomm.engine_util import comm, exchange, ptr
from tests.dicomm.multiproc import run_ranks
from tests.machine_lock import machine_lock

INTRUDER = Path(__file__).with_name("intruder.py")
INTRUDER_USER = "dicomm-intruder"
TAG, REAL, FORGED = 7, 222, 111


def _card(store, rank: int) -> dict[str, str]:
    text = store.get(f"dicomm/card/{rank}").decode()
    return dict(line.split("=", 1) for line in text.splitlines() if line)


def _run_intruder(store, transport: str, secret: str, user: str | None) -> dict:
    """Rank 1's listener, attacked by a process claiming to be rank 0 (the token as read from the store)."""
    address = _card(store, 1)[f"addr.{transport}"]
    token = store.get("dicomm/token").decode()
    args = [transport, address, token, secret, "0", "1", str(TAG), str(FORGED)]
    # As another user the venv may be out of reach: the system interpreter runs the source (stdlib only).
    cmd = ["/usr/bin/python3", "-c", INTRUDER.read_text(), *args] if user else [sys.executable, str(INTRUDER), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=30, user=user)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _attacked_job(rank, world, store, transport, warm, user, secret, greet=False):
    if secret:
        os.environ["DICOMM_JOB_SECRET"] = secret
    c = comm(store, rank, world, timeout_s=20, transport=transport)
    out = {"warm": exchange(c, rank)} if warm else {}
    if greet:  # rank 1 -> rank 0 only: rank 1 has read rank 0's card, rank 0 has not connected to it
        hello = np.zeros(1, np.int64)
        if rank == 0:
            c.irecv(ptr(hello), 8, 1, tag=99).wait()
        else:
            c.isend(ptr(hello), 8, 0, tag=99).wait()
    if rank == 1:
        got = np.zeros(1, np.int64)
        r = c.irecv(ptr(got), 8, 0, tag=TAG)
        store.set("posted", "1")
        # Polled, not store.wait: a waiting TCPStore client holds its socket, and the engine may
        # need the store meanwhile (to read the card of a connection it holds).
        while not store.check(["attacked"]):
            time.sleep(0.05)
        r.wait()
        out["value"] = int(got[0])
    else:
        store.wait(["posted"])
        out["intruder"] = _run_intruder(store, transport, "", user)
        time.sleep(0.3)  # the forged connection is closed by now: the job must not mind
        store.set("attacked", "1")
        c.isend(ptr(np.array([REAL], np.int64)), 8, 1, tag=TAG).wait()
    out["after"] = exchange(c, rank)
    out["rejected"] = c.stats()["rejected_connections"]
    if secret:
        keys = ("dicomm/token", "dicomm/card/0", "dicomm/card/1")
        out["secret_in_store"] = any(secret.encode() in store.get(k) for k in keys)
    store.set(f"done{rank}", "1")
    store.wait([f"done{1 - rank}"])
    c.close()
    return out


def _check(r0: dict, r1: dict) -> None:
    assert r1["value"] == REAL, "the forged message reached the receive"
    assert r0["intruder"]["closed"], "the forged connection was left open"
    assert r1["rejected"] >= 1
    assert r0["after"] and r1["after"], "the job stopped working after the forged connection closed"


@pytest.fixture(scope="module")
def intruder_user() -> str:
    if os.geteuid() != 0:
        pytest.skip("creating an unprivileged user for the intrusion test needs root")
    if not os.path.exists("/usr/bin/python3"):
        pytest.skip("no /usr/bin/python3 for the unprivileged intruder to run")
    with machine_lock("intruder-user"):  # another worker's module would delete the user under this one
        created = False
        try:
            pwd.getpwnam(INTRUDER_USER)
        except KeyError:
            done = subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                                   INTRUDER_USER], capture_output=True, text=True)
            if done.returncode != 0:
                pytest.skip(f"useradd failed: {done.stderr.strip()}")
            created = True
        yield INTRUDER_USER
        if created:
            subprocess.run(["userdel", INTRUDER_USER], capture_output=True)


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_second_connection_claiming_a_live_rank_is_refused_and_harmless(transport):
    """Rank 0 already has its live connection to rank 1; a second one claiming rank 0 (same user,
    another process) is refused, its message never lands, and its close does not end the job."""
    r0, r1 = run_ranks(_attacked_job, 2, transport, True, None, "")
    assert r0["warm"] and r1["warm"]
    _check(r0, r1)


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_unprivileged_user_is_refused(intruder_user, transport):
    """Before rank 0 ever connected, another uid claims rank 0, over rank 1's abstract Unix socket
    (which has no file permissions; SO_PEERCRED names the uid) or its tcp port (/proc/net/tcp names
    the owner of a connection made from this host): not the job's uid, so it is refused."""
    r0, r1 = run_ranks(_attacked_job, 2, transport, False, intruder_user, "")
    _check(r0, r1)


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_job_secret_keeps_out_whoever_reads_the_store(transport):
    """With DICOMM_JOB_SECRET (out of band), the store's token alone does not sign a valid hello,
    even for the first connection claiming a rank; the secret is never written to the store."""
    r0, r1 = run_ranks(_attacked_job, 2, transport, False, None, "s3cret-of-the-launcher")
    _check(r0, r1)
    assert not r0["intruder"]["accepted"], "the listener proved itself to a client without the secret"
    assert not r0["secret_in_store"] and not r1["secret_in_store"]


def _two_secrets_job(rank, world, store):
    os.environ["DICOMM_JOB_SECRET"] = f"secret-{rank}"
    c = comm(store, rank, world, timeout_s=5, transport="tcp")
    out = {}
    if rank == 0:
        try:
            c.isend(ptr(np.array([1], np.int64)), 8, 1, tag=3).wait()
            out["error"] = None
        except Exception as e:  # noqa: BLE001 - the test looks at what was raised
            out["error"] = f"{type(e).__name__}: {e}"
        store.set("tried", "1")
    else:
        while not store.check(["tried"]):
            time.sleep(0.05)
        time.sleep(0.3)  # a connection rank 0 made would be handled by now
        out["accepted"] = c.stats()["connections_accepted"]
    c.close()
    return out


def test_ranks_with_different_secrets_do_not_connect():
    """Each refuses the other's card (signed with another key) or, failing that, its handshake."""
    r0, r1 = run_ranks(_two_secrets_job, 2)
    assert r0["error"] and r0["error"].startswith("PeerError") and "DICOMM_JOB_SECRET" in r0["error"]
    assert r1["accepted"] == 0


@pytest.mark.parametrize("key_len", [0, 16, 64, 65, 200])
@pytest.mark.parametrize("msg_len", [0, 1, 55, 56, 63, 64, 65, 119, 120, 1000])
def test_handshake_hmac_matches_hashlib(key_len, msg_len):
    import dicomm._C as C

    rng = np.random.default_rng(key_len * 1000 + msg_len)
    key, msg = rng.bytes(key_len), rng.bytes(msg_len)
    assert C._hmac_sha256(key, msg) == hmac.new(key, msg, hashlib.sha256).digest()


def _listen_job(rank, world, store):
    c = comm(store, rank, world, transport="tcp")
    store.set(f"up{rank}", "1")
    store.wait([f"up{1 - rank}"])
    out = _card(store, rank)["addr.tcp"].rsplit(":", 1)[0]
    c.close()
    return out


def _has_non_loopback_ipv4() -> bool:
    done = subprocess.run(["ip", "-4", "-o", "addr", "show", "up"], capture_output=True, text=True)
    return any(" lo " not in line and "inet " in line for line in done.stdout.splitlines())


def test_single_host_job_listens_on_loopback_only():
    """torchrun's WORLD_SIZE == LOCAL_WORLD_SIZE: the job has no other host to talk to, so the tcp
    listener is not exposed on the machine's network interface; a multi-host job keeps it."""
    if not _has_non_loopback_ipv4():
        pytest.skip("this machine has no non-loopback IPv4 interface: every listener is on loopback anyway")
    single = run_ranks(_listen_job, 2, env={"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"})
    assert single == ["127.0.0.1", "127.0.0.1"]
    multi = run_ranks(_listen_job, 2, env={"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"})
    assert all(ip != "127.0.0.1" for ip in multi)


_READER = """
import ctypes, os, sys
class Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
libc = ctypes.CDLL(None, use_errno=True)
buf = ctypes.c_int64()
local, remote = Iovec(ctypes.addressof(buf), 8), Iovec(int(sys.argv[2]), 8)
n = libc.process_vm_readv(int(sys.argv[1]), ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
print("read" if n == 8 else os.strerror(ctypes.get_errno()))
"""


def _outsider_reads_job(rank, world, store, out_dir):
    """Rank 0 starts a same-user reader that is no descendant of the job's processes (the shell in
    between exits, so it is re-parented) and lets it read a word of rank 1's memory."""
    c = comm(store, rank, world, transport="shm")
    word = np.array([0x5EC2E7], np.int64)
    assert exchange(c, rank)  # both directions connected: each rank named its ptracer
    store.set(f"word{rank}", f"{os.getpid()} {word.ctypes.data}")
    result = None
    if rank == 0:
        pid, addr = store.get("word1").decode().split()
        out = Path(out_dir) / "reader.txt"
        subprocess.run(["sh", "-c", f'{sys.executable} -c "$0" {pid} {addr} > {out} 2>&1 &', _READER], check=True)
        deadline = time.monotonic() + 20
        while not (out.exists() and out.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.05)
        result = out.read_text().strip()
        store.set("probed", "1")
    else:
        store.wait(["probed"])
    c.close()
    return result


def test_cross_memory_attach_is_not_open_to_every_process_of_the_user(tmp_path):
    """Under Yama's ptrace_scope=1 a rank names its peers' common ancestor as its ptracer, not
    "any": a process of the same user outside the job cannot read a rank's memory."""
    try:
        scope = Path("/proc/sys/kernel/yama/ptrace_scope").read_text().strip()
    except OSError:
        pytest.skip("no Yama LSM on this kernel: ptrace access follows the uid rules, there is no ptracer to narrow")
    if scope != "1":
        pytest.skip(f"Yama ptrace_scope={scope}: only scope 1 has a ptracer exception to narrow")
    result, _ = run_ranks(_outsider_reads_job, 2, str(tmp_path))
    assert result == os.strerror(1), f"an outsider's process_vm_readv of a rank gave {result!r}"


def _attacked_job_rank0_lazy(rank, world, store, *args):
    # Rank 0 connects on first use, so the intruder comes first; rank 1 has read rank 0's card.
    if rank == 0:
        os.environ["DICOMM_CONNECT"] = "lazy"
    return _attacked_job(rank, world, store, *args, greet=True)


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_same_user_process_claiming_a_rank_before_it_connects_is_refused(transport):
    """Issue 27, point 3: without DICOMM_JOB_SECRET a process of the job's own user that reads the
    store and claims rank 0 before rank 0 ever connected is checked against rank 0's card: the
    connecting process must be the pid the card names (shared memory: SO_PEERCRED; tcp from this
    host: the process owning the connecting socket, found through /proc). It is refused, and the
    real rank 0 connects afterwards as usual."""
    r0, r1 = run_ranks(_attacked_job_rank0_lazy, 2, transport, False, None, "")
    _check(r0, r1)
