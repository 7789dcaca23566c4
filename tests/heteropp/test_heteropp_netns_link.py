"""The emulated cross-cluster link (bench/heteropp_netns.py: two network namespaces, a veth pair shaped by tc)
carries a message at its rate, as the cost model prices a link: bytes over bandwidth. Its token bucket once
held 256 KiB, a whole activation of bench.heteropp_two_clusters, which then crossed at memory speed; the
simulator, pricing the rate, over-predicted the plan that sends across the link by 26-63% in every run.
Checked with the kernel's own counters (tc's report of the queue discipline), never with a clock: a message
of 64 KiB has to wait for tokens, and the bytes the shaper sends for a message are wire_bytes' count.
Needs root, `ip` and `tc` (skipped otherwise)."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from bench.heteropp_netns import Unavailable, rate_bytes_s, two_clusters, wire_bytes

RATE = "50mbit"
PORT = 29531
_STATS = re.compile(r"Sent (\d+) bytes (\d+) pkt \(dropped (\d+), overlimits (\d+)")


@pytest.fixture(scope="module")
def link():
    try:
        with two_clusters(rate=RATE) as c:
            yield c
    except Unavailable as e:
        pytest.skip(f"emulated clusters unavailable: {e}")


def _qdisc(ns: str, ifname: str, stats: bool = False) -> str:
    return subprocess.run(["ip", "netns", "exec", ns, "tc", *(["-s"] if stats else []), "qdisc", "show", "dev", ifname],
                          capture_output=True, text=True, check=True).stdout


def _sent(link) -> tuple[int, int, int, int]:
    """A's end: bytes, packets, drops and overlimits (times a packet waited for tokens) so far."""
    a = link[0]
    m = _STATS.search(_qdisc(a.netns, a.ifname, stats=True))
    assert m, _qdisc(a.netns, a.ifname, stats=True)
    return tuple(int(x) for x in m.groups())  # type: ignore[return-value]


def _send(link, payload: int) -> None:
    """One TCP message of `payload` bytes from cluster A to cluster B, received whole."""
    a, b, _ = link
    recv = subprocess.Popen(["ip", "netns", "exec", b.netns, sys.executable, "-c",
                             "import socket,sys\n"
                             f"s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
                             f"s.bind(('{b.address}',{PORT}));s.listen(1);print('up',flush=True)\n"
                             f"c=s.accept()[0];n=0\nwhile n<{payload}:\n n+=len(c.recv(1<<20))\nc.close()"],
                            stdout=subprocess.PIPE, text=True)
    assert recv.stdout.readline().strip() == "up"
    subprocess.run(["ip", "netns", "exec", a.netns, sys.executable, "-c",
                    f"import socket\nc=socket.create_connection(('{b.address}',{PORT}))\nc.sendall(b'x'*{payload})\n"
                    "c.shutdown(socket.SHUT_WR);c.recv(1);c.close()"], check=True, timeout=60)
    assert recv.wait(timeout=60) == 0


def test_the_bucket_holds_about_a_millisecond_of_traffic_not_a_message(link):
    """tc's own report of the shaper: its bucket is at most a millisecond of the rate (or two frames), so
    one activation of the two-cluster bench (256 KiB) is at least 40 buckets and crosses at the rate."""
    a = link[0]
    m = re.search(r"burst (\d+)(b|Kb|Mb)\b", _qdisc(a.netns, a.ifname))
    if m is None:
        pytest.skip(f"the link is not shaped by tbf here: {_qdisc(a.netns, a.ifname)!r}")
    burst = int(m.group(1)) * {"b": 1, "Kb": 1024, "Mb": 1 << 20}[m.group(2)]
    assert burst <= max(rate_bytes_s(RATE) / 1000, 2 * 1514) + 1
    assert 256 * 256 * 4 >= 40 * burst


def test_a_message_waits_for_tokens_and_costs_its_wire_bytes(link):
    """A 64 KiB message (a quarter of the old bucket) is held back by the shaper (overlimits grow), nothing
    is dropped, and the bytes the shaper sent are the message's wire_bytes and the connection's few control
    frames (SYN, the final ACKs and FIN: under 10 frames of at most 100 bytes)."""
    payload = 64 * 1024
    bytes0, pkts0, drops0, over0 = _sent(link)
    _send(link, payload)
    bytes1, pkts1, drops1, over1 = _sent(link)
    assert over1 > over0, "the message passed without waiting for tokens: the bucket holds it whole"
    assert drops1 == drops0
    frames = -(-payload // 1448)
    assert frames <= pkts1 - pkts0 <= frames + 10
    assert 0 <= (bytes1 - bytes0) - wire_bytes(payload) <= 10 * 100


def test_a_probe_whose_sender_fails_leaves_no_receiver_behind(link):
    """The sender fails at once (a negative gap: time.sleep refuses it): the probe raises, and no process is
    left in cluster B's namespace (the kernel's list, `ip netns pids`) waiting for a message that never comes."""
    from bench.heteropp_link_probe import one_way_s
    with pytest.raises(subprocess.CalledProcessError):
        one_way_s(link, 1, 1000, 1, -1.0)
    left = subprocess.run(["ip", "netns", "pids", link[1].netns], capture_output=True, text=True, check=True).stdout
    for pid in left.split():  # do not leave it on the host when the test fails
        subprocess.run(["kill", "-9", pid], capture_output=True)
    assert not left.split(), f"processes left in cluster B's namespace: {left.split()}"


@pytest.mark.parametrize("args, says", [(["--rate", "fast"], "--rate: expected a positive rate"),
                                        (["--rate", "0mbit"], "--rate: expected a positive rate"),
                                        (["--bytes", "0"], "--bytes: expected an integer >= 1")])
def test_the_probe_names_a_bad_option(args, says, capsys):
    from bench.heteropp_link_probe import main
    with pytest.raises(SystemExit) as e:
        main(args)
    assert e.value.code == 2 and says in capsys.readouterr().err
