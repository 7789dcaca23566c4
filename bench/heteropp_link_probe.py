"""How long a message takes across the emulated cross-cluster link (bench/heteropp_netns.py), against its
bytes over the rate: the accounting the simulator and the cost model use for a link.

    python -m bench.heteropp_link_probe [--rate 50mbit] [--bytes 262144] [--messages 6] [--burst BYTES] [--json FILE]

A receiver in cluster B's namespace and a sender in A's, over one TCP connection per flow; every `--gap`
seconds each flow sends one message, and the time from the send to the whole message's arrival is taken on
this host's monotonic clock (both processes read the same one). One flow, then two at once (two pipelines
sharing the link): two messages sent together both arriving after twice one's time is a link shared fairly
between its flows, as the two-cluster bench's prediction charges it (dp x an activation for each pipeline's
transfer); the first arriving after one message's time would be a first-come queue. `--burst`: the token
bucket's bytes where tc shapes with tbf (default the link's one millisecond, link_burst_bytes; 262144 is the
bucket the link had before). Needs root, `ip` and `tc` (exits with the reason otherwise).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from bench.heteropp_netns import Unavailable, link_burst_bytes, rate_bytes_s, two_clusters, wire_bytes

PORT = 29533

_RECEIVER = """
import json, socket, sys, time
flows, size, count = (int(x) for x in sys.argv[2:5])
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((sys.argv[1], {port}))
s.listen(flows); print("up", flush=True)
conns = [s.accept()[0] for _ in range(flows)]
ends = []  # per round, when each flow's message had arrived whole (flows read in turn: a later flow's
for _ in range(count):  # end is exact, an earlier one's is at most the later one's)
    mine = []
    for c in conns:
        got = 0
        while got < size:
            chunk = c.recv(1 << 20)
            if not chunk:  # the sender stopped: recv would return nothing forever
                sys.exit("a flow closed before its message arrived whole")
            got += len(chunk)
        mine.append(time.perf_counter())
    ends.append(mine)
print(json.dumps(ends))
"""

_SENDER = """
import json, socket, sys, time
flows, size, count, gap = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
conns = [socket.create_connection((sys.argv[1], {port})) for _ in range(flows)]
buf, starts = b"x" * size, []
for _ in range(count):
    time.sleep(gap)
    starts.append(time.perf_counter())
    for c in conns:
        c.sendall(buf)
print(json.dumps(starts))
"""


def one_way_s(clusters, flows: int, size: int, count: int, gap: float) -> list[list[float]]:
    """Per round, per flow: from the send of `flows` messages of `size` bytes (one a flow) until that flow's
    has arrived whole."""
    a, b, _ = clusters
    args = [str(flows), str(size), str(count)]
    recv = subprocess.Popen(["ip", "netns", "exec", b.netns, sys.executable, "-c", _RECEIVER.format(port=PORT),
                             b.address, *args], stdout=subprocess.PIPE, text=True)
    if recv.stdout is None or recv.stdout.readline().strip() != "up":
        raise RuntimeError("the receiver did not start")
    try:
        sent = subprocess.run(["ip", "netns", "exec", a.netns, sys.executable, "-c", _SENDER.format(port=PORT),
                               b.address, *args, str(gap)], capture_output=True, text=True, check=True, timeout=600)
        ends = json.loads(recv.communicate(timeout=600)[0])
    finally:
        if recv.poll() is None:  # the sender failed: the receiver would wait for it past the namespaces' removal
            recv.kill()
            recv.wait()
    return [[x - s for x in e] for s, e in zip(json.loads(sent.stdout), ends)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", default="50mbit")
    ap.add_argument("--bytes", type=int, default=256 * 256 * 4, help="one message (default: an activation of "
                    "bench.heteropp_two_clusters' model)")
    ap.add_argument("--messages", type=int, default=6)
    ap.add_argument("--gap", type=float, default=0.2, help="seconds between rounds (the bucket refills)")
    ap.add_argument("--burst", type=int, help="the token bucket's bytes (default: link_burst_bytes)")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    try:
        rate = rate_bytes_s(a.rate)
    except ValueError as e:
        ap.error(f"--rate: {e}")
    for name in ("bytes", "messages", "burst"):
        if getattr(a, name) is not None and getattr(a, name) < 1:
            ap.error(f"--{name}: expected an integer >= 1, got {getattr(a, name)}")
    if not a.gap >= 0:
        ap.error(f"--gap: expected seconds >= 0, got {a.gap}")
    burst = a.burst or link_burst_bytes(a.rate)
    load = list(os.getloadavg())
    rows = []
    try:
        with two_clusters(rate=a.rate, burst=burst) as clusters:
            for flows in (1, 2):
                got = one_way_s(clusters, flows, a.bytes, a.messages, a.gap)
                rows.append({"flows": flows, "one_way_s": got, "bytes_over_rate_s": flows * a.bytes / rate,
                             "wire_over_rate_s": flows * wire_bytes(a.bytes) / rate})
    except Unavailable as e:
        print(f"skipped: {e}")
        return 0
    print(f"link {a.rate}, bucket {burst} bytes{'' if clusters[2] else ' (tbf)'}, messages of {a.bytes} bytes, "
          f"load {load[0]:.1f} -> {os.getloadavg()[0]:.1f}")
    print("flows | one way, first flow's message: median (min-max) ms | the last flow's | bytes / rate ms | "
          "wire bytes / rate ms")
    for r in rows:
        cells = []
        for t in ([x[0] for x in r["one_way_s"]], [x[-1] for x in r["one_way_s"]]):
            cells.append(f"{1e3 * statistics.median(t):.1f} ({1e3 * min(t):.1f}-{1e3 * max(t):.1f})")
        print(f"{r['flows']:>5} | {cells[0]} | {cells[1]} | {1e3 * r['bytes_over_rate_s']:.1f} | "
              f"{1e3 * r['wire_over_rate_s']:.1f}")
    if a.json:
        Path(a.json).write_text(json.dumps({"rate": a.rate, "burst": burst, "bytes": a.bytes, "rows": rows,
                                            "load_before": load, "load_after": list(os.getloadavg())}, indent=2)
                                + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
