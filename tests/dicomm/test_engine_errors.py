"""Clear errors instead of truncation, corruption or hangs: real processes on one host, a real
TCPStore; TCP over loopback stands in for a network where the test forces it."""
import pytest

from tests.dicomm.engine_util import close_pair, comm, payload, ptr
from tests.dicomm.multiproc import run_ranks


def _too_small(rank, world, store, n):
    import numpy as np

    import dicomm._C as C

    c = comm(store, rank, world, timeout_s=20)
    a = payload(n, 1)
    try:
        if rank == 0:
            r = c.isend(ptr(a), n, 1, tag=4)
        else:
            b = np.zeros(n // 2, np.uint8)
            r = c.irecv(ptr(b), b.nbytes, 0, tag=4)
        try:
            r.wait()
            return "completed"
        except C.MismatchError as e:
            return str(e)
    finally:
        # Both sides must have failed before either closes (so no error comes from a close).
        store.set(f"done{rank}", "1")
        store.wait([f"done{1 - rank}"])
        c.close()


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_buffer_too_small_fails_both_sides_for_a_large_message(transport):
    n = 1 << 20
    sent, recvd = run_ranks(_too_small, 2, n, env={"DICOMM_TRANSPORT": transport})
    assert "recv from rank 0 tag 4" in recvd and f"{n} B" in recvd and f"only {n // 2} B" in recvd
    assert "send to rank 1 tag 4" in sent and f"only {n // 2} B" in sent


def test_buffer_too_small_fails_the_receive_of_a_small_message():
    sent, recvd = run_ranks(_too_small, 2, 1000)
    # An eager send completes once buffered (MPI semantics); the receive must still fail.
    assert sent == "completed"
    assert "recv from rank 0 tag 4" in recvd and "1000 B" in recvd and "only 500 B" in recvd


def _meta(rank, world, store, n):
    import numpy as np

    import dicomm._C as C

    c = comm(store, rank, world, timeout_s=20)
    a = payload(n, 1)
    b = np.zeros(n, np.uint8)
    out = []
    if rank == 0:
        reqs = [c.isend(ptr(a), n, 1, tag=9, meta=0xAB), c.isend(ptr(a), n, 1, tag=9, meta=0xCD)]
    else:
        reqs = [c.irecv(ptr(b), n, 0, tag=9, meta=0xAB), c.irecv(ptr(b), n, 0, tag=9, meta=0x77)]
    for r in reqs:
        try:
            r.wait()
            out.append("ok")
        except C.MismatchError as e:
            out.append(str(e))
    store.set(f"done{rank}", "1")
    store.wait([f"done{1 - rank}"])
    c.close()
    return out


def test_meta_mismatch_names_both_metas():
    n = 1 << 20  # rendezvous: the sender learns of the mismatch too
    sent, recvd = run_ranks(_meta, 2, n)
    assert recvd[0] == "ok" and sent[0] == "ok"
    for text in (recvd[1], sent[1]):
        assert "0x00000000000000cd" in text and "0x0000000000000077" in text
    assert "recv from rank 0 tag 9" in recvd[1] and "send to rank 1 tag 9" in sent[1]


def _invalid(rank, world, store):
    import numpy as np

    import dicomm._C as C

    c = comm(store, rank, world)
    b = np.zeros(8, np.uint8)
    out = []
    for call in (lambda: c.isend(ptr(b), 8, world, 0), lambda: c.irecv(ptr(b), 8, -2, 0),
                 lambda: c.isend(ptr(b), 8, 0, -1), lambda: c.transport_of(99)):
        try:
            call()
            out.append("accepted")
        except C.ValueError as e:
            out.append((isinstance(e, ValueError), isinstance(e, C.DicommError), str(e)))
    try:
        C.Communicator(store, 5, world)
        out.append("accepted")
    except ValueError as e:
        out.append(str(e))
    c.close()
    return out


def test_invalid_ranks_and_tags_raise_value_errors():
    got = run_ranks(_invalid, 2)[0]
    assert got[0][:2] == (True, True) and "peer 2 is not a rank" in got[0][2]
    assert "peer -2 is not a rank" in got[1][2]
    assert "tag -1 is negative" in got[2][2]
    assert "peer 99" in got[3][2]
    assert "rank 5 is outside 0..1" in got[4]


def _timeout(rank, world, store, late_bytes):
    import time

    import numpy as np

    import dicomm._C as C

    # Both ranks up first: the communicator's 0.5 s also bounds rank 1's wait for rank 0's job token, which
    # a rank 0 started late (a loaded host, the sanitizer build) missed.
    store.set(f"up{rank}", "1")
    store.wait(["up0", "up1"])
    c = comm(store, rank, world, timeout_s=0.5)
    out = None
    n = max(late_bytes, 4096)
    if rank == 0:
        b = np.zeros(n, np.uint8)
        r = c.irecv(ptr(b), 4096, 1, tag=21)
        t0 = time.monotonic()
        try:
            r.wait()  # None: the communicator's 0.5 s
            out = "completed"
        except C.TimeoutError as e:
            out = (str(e), time.monotonic() - t0)
        # The timed-out receive was withdrawn: its message, arriving late, reaches nobody; the next
        # receive gets the message after it.
        store.set("late", "1")
        r2 = c.irecv(ptr(b), n, 1, tag=21)
        r2.wait(10)
        out = out + (r2.nbytes, int(b[0]), c.stats()["late_messages_discarded"])
    else:
        store.wait(["late"])
        late, next_one = np.full(late_bytes, 42, np.uint8), np.full(late_bytes, 43, np.uint8)
        try:
            c.isend(ptr(late), late_bytes, 0, tag=21).wait(10)
            out = "late send completed"
        except C.TimeoutError as e:  # a rendezvous send learns that its receive was given up
            out = str(e)
        c.isend(ptr(next_one), late_bytes, 0, tag=21).wait(10)
    store.set(f"done{rank}", "1")
    store.wait([f"done{1 - rank}"])
    c.close()
    return out


@pytest.mark.parametrize("late_bytes", [100, 1 << 20])
def test_wait_timeout_names_op_peer_tag_and_bytes(late_bytes):
    (text, elapsed, n, first, discarded), sender = run_ranks(_timeout, 2, late_bytes)
    assert "Timed out after 500 ms" in text and "recv from rank 1 tag 21 (4096 B)" in text
    assert 0.4 < elapsed < 5
    assert (n, first, discarded) == (late_bytes, 43, 1), "the late message was delivered to the next receive"
    if late_bytes > 16384:
        assert "Timed out" in sender and "discarded" in sender, sender


# The receiver stops the sender once the first bytes have landed; on a loaded host the receiver's
# own thread can be preempted while its progress thread takes the whole message first. Such a try
# must have received the message whole, and another one is made, so the timeout is what gets tested.
FROZEN_TRIES = 5


def _frozen_sender(rank, world, store, transport):
    import os
    import signal
    import time

    import numpy as np

    import dicomm._C as C

    c = comm(store, rank, world, timeout_s=30, transport=transport)
    n = 64 << 20
    tries = []
    if rank == 0:
        b = np.zeros(n, np.uint8)
        sender = int(store.get("pid1"))
        for i in range(FROZEN_TRIES):
            b[:] = 0
            r = c.irecv(ptr(b), n, 1, tag=3 + i)
            store.set(f"posted{i}", "1")
            deadline = time.monotonic() + 20
            while b[0] == 0 and time.monotonic() < deadline:  # the first bytes have landed:
                time.sleep(0.0005)
            os.kill(sender, signal.SIGSTOP)  # freeze the sender mid-transfer
            try:
                r.wait(1.5)
                os.kill(sender, signal.SIGCONT)
                tries.append(("completed before the timeout", bool((b == 7).all())))
                store.set(f"verdict{i}", "again")
                continue
            except C.TimeoutError as e:
                at_timeout = int(np.count_nonzero(b))
                os.kill(sender, signal.SIGCONT)  # the sender goes on
                store.wait([f"sent{i}"])
                time.sleep(0.5)
                tries.append((str(e), at_timeout, int(np.count_nonzero(b))))
                store.set(f"verdict{i}", "done")
                break
            finally:
                os.kill(sender, signal.SIGCONT)
    else:
        store.set("pid1", str(os.getpid()))
        a = np.full(n, 7, np.uint8)
        for i in range(FROZEN_TRIES):
            store.wait([f"posted{i}"])
            c.isend(ptr(a), n, 0, tag=3 + i).wait()
            store.set(f"sent{i}", "1")
            store.wait([f"verdict{i}"])
            if store.get(f"verdict{i}") == b"done":
                break
    store.set(f"done{rank}", "1")
    store.wait([f"done{1 - rank}"])
    c.close()
    return tries


def _frozen_try(tries: list) -> tuple[str, int, int]:
    """The try that timed out, after checking that every try before it received the whole message."""
    *completed, last = tries
    assert all(t == ("completed before the timeout", True) for t in completed), tries
    if last[0] == "completed before the timeout":
        assert last[1], f"a receive that completed holds wrong data: {tries}"
        pytest.skip(f"in {FROZEN_TRIES} tries the whole message arrived before the sender was stopped "
                    f"(each completed receive was whole)")
    text, at_timeout, later = last
    assert "matched a message from rank 1" in text, f"the transfer had not started: {text}"
    assert 0 < at_timeout < 64 << 20, f"the receive timed out with {at_timeout} bytes written, not mid-transfer"
    return text, at_timeout, later


def test_timed_out_receive_is_never_written_after_its_timeout_over_tcp():
    """A 64 MiB receive over tcp whose sender freezes mid-transfer (SIGSTOP) times out; when the
    sender resumes, the rest of the message is read and dropped: the buffer is the caller's again
    (today the remaining bytes land in it after the TimeoutError)."""
    tries, _ = run_ranks(_frozen_sender, 2, "tcp", timeout=180)
    text, at_timeout, later = _frozen_try(tries)
    assert later == at_timeout, f"{later - at_timeout} bytes landed after the TimeoutError"


def _overtaken_timeout(rank, world, store, transport, n):
    import numpy as np

    import dicomm._C as C

    c = comm(store, rank, world, timeout_s=20, transport=transport)
    out = None
    if rank == 0:
        first, second, third = (np.zeros(n, np.uint8) for _ in range(3))
        r1 = c.irecv(ptr(first), n, 1, tag=22)
        r2 = c.irecv(ptr(second), n, 1, tag=22)
        try:  # the second receive gives up while the first still waits: it gave up on message 2
            r2.wait(0.3)
            timed_out = False
        except C.TimeoutError:
            timed_out = True
        store.set("go", "1")
        r1.wait(10)
        r3 = c.irecv(ptr(third), n, 1, tag=22)
        r3.wait(10)
        out = (timed_out, int(first[0]), int(third[0]), c.stats()["late_messages_discarded"])
    else:
        store.wait(["go"])
        _send_values(c, (1, 2, 3), n, tag=22)
    close_pair(c, store, rank)
    return out


def _send_values(c, values, n: int, tag: int) -> None:
    """Sends each value as an n-byte message to rank 0, one after the other."""
    import numpy as np

    import dicomm._C as C

    for value in values:
        data = np.full(n, value, np.uint8)  # alive until the receiver has read it
        try:
            c.isend(ptr(data), n, 0, tag=tag).wait(10)
        except C.TimeoutError:  # a rendezvous send learns that its receive was given up
            pass


@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("n", [100, 1 << 20])
def test_timed_out_receive_discards_its_own_message_not_an_earlier_receives(transport, n):
    """Two receives from one (source, tag); the later one times out while the earlier one waits.
    The earlier receive gets message 1, message 2 (the timed-out receive's) is discarded and the
    next receive gets message 3 (a plain "discard the next one" marker ate message 1 instead)."""
    out, _ = run_ranks(_overtaken_timeout, 2, transport, n)
    assert out == (True, 1, 3, 1), f"(timed out, first receive, next receive, discarded) = {out}"


def test_timed_out_receive_is_never_written_after_its_timeout_over_shm():
    """The same over shared memory streamed through the chunk ring (no cross-memory attach): the
    frozen sender's remaining chunks are consumed and dropped once it resumes (before, they were
    copied into the buffer after the TimeoutError)."""
    tries, _ = run_ranks(_frozen_sender, 2, "shm", timeout=180, env={"DICOMM_SHM_CMA": "0"})
    text, at_timeout, later = _frozen_try(tries)
    assert later == at_timeout, f"{later - at_timeout} bytes landed after the TimeoutError"
    assert "never written again" in text, text


def _any_source_timeouts(rank, world, store, transport, n, case):
    """Rank 1 sends messages 1, 2, 3 on one tag once rank 0's receive(s) have timed out."""
    import numpy as np

    import dicomm._C as C

    c = comm(store, rank, world, timeout_s=20, transport=transport)
    out = None
    if rank == 0:
        bufs = [np.zeros(n, np.uint8) for _ in range(3)]
        if case == "behind":  # a receive from rank 1 times out behind an any-source receive
            first = c.irecv(ptr(bufs[0]), n, -1, tag=23)
            given_up = c.irecv(ptr(bufs[1]), n, 1, tag=23)
        else:  # an any-source receive times out on its own
            given_up = c.irecv(ptr(bufs[1]), n, -1, tag=23)
        try:
            given_up.wait(0.3)
            timed_out = False
        except C.TimeoutError:
            timed_out = True
        store.set("go", "1")
        if case == "behind":
            first.wait(10)
            nxt = c.irecv(ptr(bufs[2]), n, 1, tag=23)
            nxt.wait(10)
            got = [(first.source, int(bufs[0][0])), (nxt.source, int(bufs[2][0]))]
        else:
            by_source = c.irecv(ptr(bufs[0]), n, 1, tag=23)
            by_source.wait(10)
            any_source = c.irecv(ptr(bufs[2]), n, -1, tag=23)
            any_source.wait(10)
            got = [(by_source.source, int(bufs[0][0])), (any_source.source, int(bufs[2][0]))]
        out = (timed_out, got, c.stats()["late_messages_discarded"], int(bufs[1][0]))
    else:
        store.wait(["go"])
        _send_values(c, (1, 2, 3) if case == "behind" else (1, 2), n, tag=23)
    close_pair(c, store, rank)
    return out


@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("n", [100, 1 << 20])
def test_a_receive_that_times_out_behind_an_any_source_receive_discards_its_own_message(transport, n):
    """Which message such a receive would have taken depends on what the any-source receive ahead
    of it takes first. The any-source receive gets message 1, message 2 (the timed-out receive's)
    is discarded, the next receive gets 3. Before, the first message of the stream was discarded
    by number, and the any-source receive got message 2."""
    out, _ = run_ranks(_any_source_timeouts, 2, transport, n, "behind")
    assert out == (True, [(1, 1), (1, 3)], 1, 0), f"(timed out, (source, value)s, discarded, untouched) = {out}"


@pytest.mark.parametrize("n", [100, 1 << 20])
def test_an_any_source_receive_that_times_out_claims_no_message(n):
    """The contract: an any-source receive serves whichever sender comes first, so no message is
    its own. One that arrives after it timed out goes to the next receive that accepts it, here
    one from its source, and one sender's messages keep their order: nothing is dropped (a server
    receiving from any source with a timeout, then again, gets every request), and the timed-out
    receive's buffer is never written."""
    out, _ = run_ranks(_any_source_timeouts, 2, "auto", n, "alone")
    assert out == (True, [(1, 1), (1, 2)], 0, 0), f"(timed out, (source, value)s, discarded, untouched) = {out}"


def _self_receive_times_out(rank, world, store, case):
    """A receive from this rank itself times out; then three messages to itself on that tag."""
    import numpy as np

    import dicomm._C as C

    c = comm(store, rank, world, timeout_s=20)
    bufs = [np.zeros(8, np.int64) for _ in range(4)]
    if case == "behind":  # behind an any-source receive with the same tag
        first = c.irecv(ptr(bufs[0]), 8, -1, tag=31)
    given_up = c.irecv(ptr(bufs[3]), 8, rank, tag=31)
    try:
        given_up.wait(0.2)
        timed_out = False
    except C.TimeoutError:
        timed_out = True
    values = [np.array([v], np.int64) for v in (1, 2, 3)]
    sends = [c.isend(ptr(v), 8, rank, tag=31) for v in values]
    if case != "behind":
        first = c.irecv(ptr(bufs[0]), 8, rank, tag=31)
    later = [c.irecv(ptr(b), 8, rank, tag=31) for b in bufs[1:3]]
    got = []
    for r, b in zip([first, *later], bufs):
        r.wait(5)
        got.append(int(b[0]))
    for s in sends:
        s.wait(5)
    out = (timed_out, got, c.stats()["late_messages_discarded"], int(bufs[3][0]))
    c.close()
    return out


@pytest.mark.parametrize("case", ["alone", "behind"])
def test_a_receive_from_itself_that_times_out_loses_no_later_message_to_itself(case):
    """A message to this rank itself is matched the moment it is sent, so a self-receive that
    times out never had a message on its way: nothing sent afterwards is late, and each later
    message must reach a receive in order. Before, the timed-out receive recorded a number that
    self-sends never carry (kept for good), and behind an any-source receive left a placeholder
    that discarded message 2: the any-source receive got 1, the next 3, and the last one timed out."""
    (out,) = run_ranks(_self_receive_times_out, 1, case)
    assert out == (True, [1, 2, 3], 0, 0), f"(timed out, values, discarded, untouched) = {out}"
