"""The connecting side authenticates a listener on another host (issue 27, point 2).

"Another host" is a network namespace joined to this one by a veth pair: from the connecting rank,
the listening end is not in its /proc/net/tcp, so no uid or pid of it can be seen and only the
handshake can tell. A genuine card for rank 1 (signed with the job's key, as if rank 1 had
published it) names an address that a hostile listener now holds (rank 1 gone, its address taken
over). The listener knows the store's token, not DICOMM_JOB_SECRET, and answers the handshake with
a proof made from the token alone: with a secret, the connecting rank must refuse it before it
sends anything; without one, the token is the whole key and the listener gets the payload, as the
threat model in docs/architecture.md says (this case keeps that table honest)."""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tests.dicomm.engine_util import comm, ptr
from tests.dicomm.multiproc import run_ranks
from tests.dicomm.test_engine_intruders import INTRUDER

NEEDLE = "SECRET-PAYLOAD"
SECRET = "launcher-secret"
HOST_IP, REMOTE_IP = "10.227.0.1", "10.227.0.2"


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True)


@pytest.fixture
def remote_host():
    """A network namespace behind a veth pair: the name of the namespace."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2")
    ns, veth = f"dcm27-{os.getpid()}", f"d27h{os.getpid() % 100000}"
    steps = [("netns", "add", ns),
             ("link", "add", veth, "type", "veth", "peer", "name", "d27r", "netns", ns),
             ("addr", "add", f"{HOST_IP}/24", "dev", veth), ("link", "set", veth, "up"),
             ("-n", ns, "addr", "add", f"{REMOTE_IP}/24", "dev", "d27r"), ("-n", ns, "link", "set", "d27r", "up"),
             ("-n", ns, "link", "set", "lo", "up")]
    try:
        for step in steps:
            done = _ip(*step)
            if done.returncode != 0:
                pytest.skip(f"ip {' '.join(step)} failed: {done.stderr.strip()}")
        yield ns
    finally:
        _ip("link", "del", veth)
        _ip("netns", "del", ns)


def _send_to_taken_over_address(rank, world, store, ns, secret):
    import dicomm._C as C

    if secret:
        os.environ["DICOMM_JOB_SECRET"] = secret
    c = comm(store, 0, 2, timeout_s=10, transport="tcp")  # rank 1 is gone; its address is taken
    token = store.get("dicomm/token").decode()
    proc = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, str(INTRUDER), "listen-tcp", token, "",
                             NEEDLE, "6", REMOTE_IP], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    address = json.loads(proc.stdout.readline())["address"]
    body = f"boot_id=another-host\nhostname=another-host\npid=1\naddr.tcp={address}\n"
    if secret:  # genuine: signed with the job's key, as rank 1 itself would have
        key = bytes.fromhex(token) + secret.encode()
        body += "mac=" + hmac.new(key, f"dicomm card\ndicomm/\n1\n{body}".encode(), hashlib.sha256).hexdigest() + "\n"
    store.set("dicomm/card/1", body)
    payload = np.frombuffer(NEEDLE.encode(), np.uint8).copy()
    try:
        c.isend(ptr(payload), payload.size, 1, tag=5).wait()
        error = None
    except C.DicommError as e:
        error = f"{type(e).__name__}: {e}"
    out, err = proc.communicate(timeout=30)
    c.close()
    return {"error": error, "listener": json.loads(out.strip().splitlines()[-1]), "stderr": err[-2000:]}


def test_with_a_secret_a_listener_on_another_host_must_prove_the_key(remote_host):
    (r0,) = run_ranks(_send_to_taken_over_address, 1, remote_host, SECRET, timeout=60)
    assert not r0["listener"]["got"], f"the listener received the payload: {r0}"
    assert r0["error"] and r0["error"].startswith("PeerError"), r0
    assert "rank 1" in r0["error"] and "could not prove" in r0["error"], r0


def test_without_a_secret_a_listener_on_another_host_is_not_refused(remote_host):
    """The documented gap: the store's token is the whole key, and nothing on this host can see
    the listener's process."""
    (r0,) = run_ranks(_send_to_taken_over_address, 1, remote_host, "", timeout=60)
    assert r0["listener"]["handshake"] and r0["listener"]["got"], r0
