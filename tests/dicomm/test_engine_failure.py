"""A dying peer, abort and close: real processes that really exit (os._exit, no cleanup), so the
kernel closing their sockets is what the survivors notice. One host; TCP over loopback stands in
for a network where forced."""
import pytest

from tests.dicomm.engine_util import comm, ptr
from tests.dicomm.multiproc import run_ranks

TIMEOUT_S = 60.0  # the communicator's; failures must come far sooner
# "Promptly": well inside the timeout, so a failure that waited it out is caught, while no
# preemption of a loaded host (hundreds of ms, seconds at worst) reaches the bound.
PROMPT_S = TIMEOUT_S / 4
# Larger than any kernel socket buffering (one TCP stream: <= 36 MiB here), so a dead sender
# cannot have handed it all over before dying.
BIG = 256 << 20


def _dies_mid_transfer(rank, world, store, sender_dies):
    import os
    import time

    import numpy as np

    import dicomm._C as C

    c = comm(store, rank, world, timeout_s=TIMEOUT_S)
    dying = 1 if sender_dies else 0
    if rank == 1:  # the sender
        a = np.ones(BIG, np.uint8)
        r = c.isend(ptr(a), BIG, 0, tag=1)
        if sender_dies:
            store.wait(["posted"])
            end = time.monotonic() + 0.005
            while time.monotonic() < end:
                r.test()  # move some of the data, then vanish mid-transfer
            os._exit(0)
    else:
        b = np.zeros(BIG, np.uint8)
        r = c.irecv(ptr(b), BIG, 1, tag=1) if sender_dies else None
        store.set("posted", "1")
        if not sender_dies:
            time.sleep(0.05)  # let the announcement arrive, take nothing, vanish
            os._exit(0)
    assert rank != dying
    t0 = time.monotonic()
    try:
        r.wait()
        # Only a sender can finish before dying (its thread was preempted past the 5 ms while its
        # progress thread moved everything); then the data must be whole.
        return "completed", bool(sender_dies and (b == 1).all())
    except C.PeerError as e:
        return "failed", str(e), time.monotonic() - t0
    finally:
        c.close()


# On a loaded host the dying sender may have sent everything before it exits; each such try is
# checked for whole data and the run is repeated, so the failure path is what gets tested.
SENDER_DEATH_TRIES = 4


@pytest.mark.parametrize("transport,env", [
    ("shm", {"DICOMM_TRANSPORT": "shm"}),
    ("shm", {"DICOMM_TRANSPORT": "shm", "DICOMM_SHM_CMA": "0"}),
    ("tcp", {"DICOMM_TRANSPORT": "tcp", "DICOMM_TCP_STREAMS": "1"}),
])
def test_a_sender_dying_mid_transfer_fails_the_receive_promptly(transport, env):
    for _ in range(SENDER_DEATH_TRIES):
        got = run_ranks(_dies_mid_transfer, 2, True, env=env, expect_dead=[1])[0]
        if got[0] == "failed":
            break
        assert got == ("completed", True), f"a receive that completed holds wrong data: {got}"
    else:
        pytest.skip(f"in {SENDER_DEATH_TRIES} tries the sender sent all {BIG >> 20} MiB before it "
                    f"died (a host this fast needs a larger message); each completed receive was whole")
    _, text, elapsed = got
    assert "recv from rank 1 tag 1" in text and "rank 1 is gone" in text
    assert elapsed < PROMPT_S, f"the receive failed after {elapsed:.1f} s"


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_receiver_dying_fails_the_pending_send_promptly(transport):
    status, text, elapsed = run_ranks(_dies_mid_transfer, 2, False, env={"DICOMM_TRANSPORT": transport},
                                      expect_dead=[0])[1]
    assert status == "failed", "a send completed to a receiver that took nothing and died"
    assert "send to rank 0 tag 1" in text and "rank 0 is gone" in text
    assert elapsed < PROMPT_S, f"the send failed after {elapsed:.1f} s"


def _abort_and_close(rank, world, store):
    import threading
    import time

    import numpy as np

    import dicomm._C as C

    c = comm(store, rank, world, timeout_s=TIMEOUT_S)
    out = []
    if rank == 0:
        b = np.zeros(1 << 20, np.uint8)
        r = c.irecv(ptr(b), b.nbytes, 1, tag=5)
        threading.Timer(0.2, c.abort, args=("test says stop",)).start()
        t0 = time.monotonic()
        try:
            r.wait()
        except C.PeerError as e:
            out.append((str(e), time.monotonic() - t0 < PROMPT_S))
        try:
            c.isend(ptr(b), 8, 1, tag=5).wait()
        except C.PeerError as e:
            out.append(str(e))
    store.set(f"done{rank}", "1")
    store.wait([f"done{1 - rank}"])
    c.close()
    c.close()  # idempotent
    try:
        c.irecv(0, 0, 0, tag=1).wait()
    except C.PeerError as e:
        out.append(str(e))
    return out


def test_abort_fails_pending_and_later_requests_and_close_is_idempotent():
    got = run_ranks(_abort_and_close, 2)[0]
    assert "recv from rank 1 tag 5" in got[0][0] and "test says stop" in got[0][0] and got[0][1]
    assert "send to rank 1 tag 5" in got[1] and "test says stop" in got[1]
    assert "communicator" in got[2]


# A whole interpreter per rank (not a multiprocessing child, which ends in os._exit): the script
# ends with its communicator open, mid-conversation with a peer that is still running, so the real
# interpreter exit (exit hooks, then finalization) must close it.
_LEAVE_OPEN = """
import datetime, sys
import numpy as np
import torch.distributed as dist
from tests.dicomm.engine_util import comm, ptr
rank, port = int(sys.argv[1]), int(sys.argv[2])
store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=30))
c = comm(store, rank, 2, timeout_s=60)
a = np.zeros(8, np.uint8)
if rank == 0:
    c.isend(ptr(a), 8, 1, tag=1).wait()
    c.irecv(ptr(a), 8, 1, tag=2)  # pending at exit: rank 1 never answers
else:
    c.irecv(ptr(a), 8, 0, tag=1).wait()
print("reported", flush=True)
"""


def test_an_unclosed_communicator_does_not_hang_interpreter_exit():
    import datetime
    import subprocess
    import sys
    from pathlib import Path

    import torch.distributed as dist

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=datetime.timedelta(seconds=30))
    root = Path(__file__).parents[2]
    procs = [subprocess.Popen([sys.executable, "-c", _LEAVE_OPEN, str(r), str(server.port)], cwd=root,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
    problems = []
    for r, p in enumerate(procs):
        try:
            out, err = p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            problems.append(f"rank {r} did not exit within 30 s (reported: {'reported' in out})")
            continue
        if p.returncode != 0 or "reported" not in out:
            problems.append(f"rank {r} exited with code {p.returncode}:\n{err[-2000:]}")
    assert not problems, "\n".join(problems)


def _any_source_survives(rank, world, store):
    import os
    import time

    import numpy as np

    import dicomm._C as C

    c = comm(store, rank, world, timeout_s=TIMEOUT_S)
    b = np.zeros(16, np.uint8)
    if rank == 2:
        c.isend(ptr(b), 16, 0, tag=1).wait()
        store.wait(["posted"])
        os._exit(0)
    if rank == 1:
        store.wait(["go"])
        a = np.full(16, 1, np.uint8)
        c.isend(ptr(a), 16, 0, tag=5).wait()
        store.wait(["posted2"])
        os._exit(0)
    c.irecv(ptr(b), 16, 2, tag=1).wait()
    r = c.irecv(ptr(b), 16, -1, tag=5)
    store.set("posted", "1")
    deadline = time.monotonic() + 10
    while c.stats()["peers_lost"] < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    store.set("go", "1")
    r.wait()  # rank 2's death did not fail it: rank 1 answers
    out = [r.source, int(b[0])]
    r2 = c.irecv(ptr(b), 16, -1, tag=6)
    store.set("posted2", "1")
    t0 = time.monotonic()
    try:
        r2.wait()
        out.append("completed")
    except C.PeerError as e:
        out.append((str(e), time.monotonic() - t0 < PROMPT_S))
    c.close()
    return out


def test_any_source_receive_fails_only_when_no_sender_is_left():
    source, value, (text, prompt) = run_ranks(_any_source_survives, 3, expect_dead=[1, 2])[0]
    assert (source, value) == (1, 1)
    assert "recv from any rank tag 6" in text and "rank 1 is gone" in text and prompt
