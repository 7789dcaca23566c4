"""`_C_bench._pingpong` and `_C_bench._stream`, the benchmark's C++ loops over a Communicator: real processes,
bytes checked against payloads each side regenerates on its own, counters against the loop's own arithmetic."""
import pytest

from tests.dicomm.engine_util import comm, payload, ptr
from tests.dicomm.multiproc import run_ranks


def _pingpong(rank, world, store, nbytes, iters):
    import numpy as np

    import dicomm._C_bench as B

    c = comm(store, rank, world)
    out = payload(nbytes, 7 + rank)
    got = np.zeros(nbytes, np.uint8)
    samples = B._pingpong(c, 1 - rank, ptr(out), ptr(got), nbytes, iters, rank == 0, tag=3, timeout_s=30)
    after = c.stats()
    ok = bool(np.array_equal(got, payload(nbytes, 7 + (1 - rank))))
    sent, received = after["messages_sent"], after["messages_received"]  # the communicator carried nothing else
    c.close()
    return list(samples), ok, sent, received


@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("nbytes", [0, 8, 70_000])
def test_native_pingpong_moves_the_bytes_and_times_each_round_trip(transport, nbytes):
    iters = 50
    res = run_ranks(_pingpong, 2, nbytes, iters, env={"DICOMM_TRANSPORT": transport})
    (s0, ok0, sent0, recv0), (s1, ok1, sent1, recv1) = res
    assert ok0 and ok1, "a side did not end with the peer's bytes"
    assert len(s0) == iters and all(t > 0 for t in s0), "the initiator reports one positive duration per round trip"
    assert s1 == [], "the answering side reports nothing"
    assert (sent0, recv0, sent1, recv1) == (iters, iters, iters, iters)


def _stream(rank, world, store, nbytes, window, iters):
    import numpy as np

    import dicomm._C_bench as B

    c = comm(store, rank, world)
    out = payload(nbytes, 21)
    land = np.zeros(max(1, nbytes * window), np.uint8)
    windows = B._stream(c, 1 - rank, ptr(out), ptr(land), nbytes, window, iters, rank == 0, tag=4, timeout_s=30)
    after = c.stats()
    want = payload(nbytes, 21)
    ok = rank == 0 or all(np.array_equal(land[w * nbytes:(w + 1) * nbytes], want) for w in range(window))
    sent, received = after["messages_sent"], after["messages_received"]
    c.close()
    return list(windows), bool(ok), sent, received


@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("nbytes", [8, 70_000])
def test_native_stream_lands_every_message_of_a_window_and_times_each_window(transport, nbytes):
    window, iters = 5, 4
    (w0, _, sent0, recv0), (w1, ok1, sent1, recv1) = run_ranks(_stream, 2, nbytes, window, iters,
                                                               env={"DICOMM_TRANSPORT": transport})
    assert ok1, "a slice of the receiver's window does not hold the sender's bytes"
    assert len(w0) == iters and all(t > 0 for t in w0) and w1 == []
    # per window: `window` messages one way, a 1 B acknowledgement back
    assert (sent0, recv0, sent1, recv1) == (window * iters, iters, iters, window * iters)


# Per loop: valid arguments, then one bad argument per call ("self": this rank as the peer) and the
# words its error must contain.
BAD = {
    "_pingpong": (dict(nbytes=8, iters=1, initiator=True, tag=3, timeout_s=5.0),
                  [({"peer": "self"}, "peer other than this rank"), ({"iters": -1}, "iters must be >= 0"),
                   ({"tag": -2}, "tag -2 is negative"), ({"timeout_s": 0.0}, "timeout_s must be positive")]),
    "_stream": (dict(nbytes=8, window=1, iters=1, sender=True, tag=3, timeout_s=5.0),
                [({"peer": "self"}, "peer other than this rank"), ({"window": 0}, "window must be >= 1"),
                 ({"iters": -1}, "iters >= 0"), ({"tag": -1}, "tag -1 is not in"),
                 ({"timeout_s": -1.0}, "timeout_s must be positive")]),
}


def _bad_args(rank, world, store, loop):
    import numpy as np

    import dicomm._C as C
    import dicomm._C_bench as B

    c = comm(store, rank, world)
    buf = np.zeros(8, np.uint8)
    valid, cases = BAD[loop]
    errors = []
    for bad, _ in cases:
        kwargs = valid | {"peer": 1 - rank} | {k: rank if v == "self" else v for k, v in bad.items()}
        try:
            getattr(B, loop)(c, send_ptr=ptr(buf), recv_ptr=ptr(buf), **kwargs)
            errors.append(None)
        except C.ValueError as e:
            errors.append(str(e))
    c.close()
    return errors


@pytest.mark.parametrize("loop", list(BAD))
def test_native_loops_refuse_bad_arguments_by_name(loop):
    errors = run_ranks(_bad_args, 2, loop)[0]
    for (bad, words), error in zip(BAD[loop][1], errors):
        assert error is not None and words in error, (bad, error)


def test_benchmark_loops_live_outside_the_production_module():
    """The production `_C` carries no benchmark code; `_C_bench` refuses anything but a Communicator."""
    import dicomm._C as C
    import dicomm._C_bench as B

    assert not [name for name in ("_pingpong", "_stream") if hasattr(C, name)]
    with pytest.raises(C.ValueError, match="expected a dicomm._C.Communicator, got object"):
        B._pingpong(object(), 1, 0, 0, 8, 1, True)
