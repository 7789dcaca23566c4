"""The connecting side authenticates the listener (issue 27, point 2). Another local user (an
unprivileged uid, no DICOMM_JOB_SECRET) who can write the c10d store replaces rank 1's address card
with its own listener and plays the listener's side of the handshake (it can: the token is in the
store). Rank 0 must not send it rank 1's payload: over shared memory the connector checks the
listener's uid (SO_PEERCRED), over tcp from this host the owner of the listening end
(/proc/net/tcp), as listeners check connectors."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tests.dicomm.engine_util import comm, ptr
from tests.dicomm.multiproc import run_ranks
from tests.dicomm.test_engine_intruders import INTRUDER, intruder_user  # noqa: F401  (a fixture)

NEEDLE = "SECRET-PAYLOAD"


def _impostor(user: str, kind: str, token: str) -> subprocess.Popen:
    args = [kind, token, "", NEEDLE, "6"]
    cmd = ["/usr/bin/python3", "-c", INTRUDER.read_text(), *args] if user else [sys.executable, str(INTRUDER), *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, user=user)


def _redirected_send(rank, world, store, transport, user):
    import dicomm._C as C

    c = comm(store, 0, 2, timeout_s=10, transport=transport)  # rank 1 never starts: its card is forged
    token = store.get("dicomm/token").decode()
    proc = _impostor(user, f"listen-{transport}", token)
    address = json.loads(proc.stdout.readline())["address"]
    card = store.get("dicomm/card/0").decode().splitlines()
    forged = [ln for ln in card if not ln.startswith(("addr.", "pid="))]
    forged += [f"pid={proc.pid}", f"addr.{transport}={address}"]
    store.set("dicomm/card/1", "\n".join(forged) + "\n")
    payload = np.frombuffer(NEEDLE.encode(), np.uint8).copy()
    try:
        c.isend(ptr(payload), payload.size, 1, tag=5).wait()
        error = None
    except C.DicommError as e:
        error = f"{type(e).__name__}: {e}"
    out, err = proc.communicate(timeout=30)
    c.close()
    return {"error": error, "impostor": json.loads(out.strip().splitlines()[-1]), "stderr": err[-2000:]}


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_listener_of_another_user_never_gets_a_ranks_payload(intruder_user, transport):  # noqa: F811
    (r0,) = run_ranks(_redirected_send, 1, transport, intruder_user, timeout=60)
    assert not r0["impostor"]["got"], f"the impostor received the payload: {r0}"
    assert r0["error"] and r0["error"].startswith("PeerError"), r0
    assert "uid" in r0["error"] and "rank 1" in r0["error"], r0
