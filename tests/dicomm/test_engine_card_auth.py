"""Address cards are untrusted data (issue 27, points 2 and 3). Real communicators in real
processes on one host, a hostile process (tests/dicomm/intruder.py) of the job's own user that can
read and write the c10d store.

- With DICOMM_JOB_SECRET, cards are signed with the job's key: a card rewritten in the store (to
  send a rank's traffic elsewhere), or another rank's genuine card copied in its place, is refused,
  naming the rank, before anything is sent.
- Without a secret, a connection from a process of this host that arrives before its rank's card
  was read delivers nothing until the card shows whether that process is the rank: an impostor
  that comes first is refused once the card is read, and never reaches a posted receive."""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.dicomm.engine_util import comm, ptr
from tests.dicomm.multiproc import run_ranks
from tests.dicomm.test_engine_intruders import INTRUDER, _attacked_job, _check

SECRET = "launcher-secret"
NEEDLE = "SECRET-PAYLOAD"


def _listening_impostor(transport: str, token: str) -> tuple[subprocess.Popen, str]:
    """A listener of the job's user that knows the store's token but not the secret."""
    proc = subprocess.Popen([sys.executable, str(INTRUDER), f"listen-{transport}", token, "", NEEDLE, "6"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, json.loads(proc.stdout.readline())["address"]


def _send_to_forged_card(rank, world, store, transport, how):
    import dicomm._C as C

    os.environ["DICOMM_JOB_SECRET"] = SECRET
    c = comm(store, 0, 2, timeout_s=10, transport=transport)  # rank 1 never starts: its card is forged
    card = store.get("dicomm/card/0").decode()
    proc = None
    if how == "rewritten":  # rank 0's card, its address and pid replaced by the impostor's, unsigned
        proc, address = _listening_impostor(transport, store.get("dicomm/token").decode())
        lines = [ln for ln in card.splitlines() if not ln.startswith(("addr.", "pid=", "mac="))]
        card = "\n".join(lines + [f"pid={proc.pid}", f"addr.{transport}={address}"]) + "\n"
    store.set("dicomm/card/1", card)  # "replayed": rank 0's own signed card, as rank 1's
    payload = np.frombuffer(NEEDLE.encode(), np.uint8).copy()
    try:
        c.isend(ptr(payload), payload.size, 1, tag=5).wait()
        error = None
    except C.DicommError as e:
        error = f"{type(e).__name__}: {e}"
    got = False
    if proc:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
        got = NEEDLE in out and '"got": true' in out
    c.close()
    return {"error": error, "impostor_got": got}


@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("how", ["rewritten", "replayed"])
def test_with_a_secret_a_forged_card_is_refused_naming_the_rank(transport, how):
    (r0,) = run_ranks(_send_to_forged_card, 1, transport, how, timeout=60)
    assert not r0["impostor_got"], r0
    assert r0["error"] and r0["error"].startswith("PeerError"), r0
    assert "address card of rank 1" in r0["error"] and "DICOMM_JOB_SECRET" in r0["error"], r0


def _genuine_signed_cards(rank, world, store):
    os.environ["DICOMM_JOB_SECRET"] = SECRET
    from tests.dicomm.engine_util import exchange

    c = comm(store, rank, world, timeout_s=20, transport="tcp")
    ok = exchange(c, rank)
    # The signature, recomputed with hashlib: HMAC-SHA-256 under token + secret over the label,
    # the round's scope, the rank and the card's text.
    text = store.get(f"dicomm/card/{rank}").decode()
    body, _, mac = text.rstrip("\n").rpartition("\n")
    key = bytes.fromhex(store.get("dicomm/token").decode()) + SECRET.encode()
    msg = f"dicomm card\ndicomm/\n{rank}\n{body}\n".encode()
    signed = mac == "mac=" + hmac.new(key, msg, hashlib.sha256).hexdigest()
    store.set(f"done{rank}", "1")
    store.wait([f"done{1 - rank}"])
    c.close()
    return ok, signed


def test_with_a_secret_genuine_cards_are_signed_and_accepted():
    assert run_ranks(_genuine_signed_cards, 2) == [(True, True), (True, True)]


def _attacked_before_any_card_is_read(rank, world, store, transport):
    # Both ranks connect on first use: rank 1 posts its receive from rank 0 without having read
    # rank 0's card, and rank 0 has not connected yet when the impostor claims to be it.
    os.environ["DICOMM_CONNECT"] = "lazy"
    return _attacked_job(rank, world, store, transport, False, None, "")


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_connection_before_the_card_is_read_delivers_nothing(transport):
    r0, r1 = run_ranks(_attacked_before_any_card_is_read, 2, transport)
    _check(r0, r1)
