"""A benchmark holding the emulated clusters (bench/heteropp_netns.two_clusters) that is stopped with SIGTERM, as
`timeout` and job schedulers stop it, removes its network namespaces: before, the default SIGTERM action ended the
interpreter without running the context's cleanup, and the namespaces stayed on the host. Needs root, `ip` and `tc`
(skipped otherwise)."""
from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from bench.heteropp_netns import Unavailable, two_clusters

_HOLD = """
import sys, time
from bench.heteropp_netns import two_clusters
with two_clusters(rate="1gbit") as (a, b, _):
    print(a.netns, b.netns, flush=True)
    time.sleep(60)
"""


def _namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def test_sigterm_removes_the_namespaces():
    try:
        with two_clusters(rate="1gbit"):
            pass
    except Unavailable as e:
        pytest.skip(f"emulated clusters unavailable: {e}")
    p = subprocess.Popen([sys.executable, "-c", _HOLD], stdout=subprocess.PIPE, text=True)
    try:
        made = set(p.stdout.readline().split())
        assert len(made) == 2 and made <= _namespaces()
        p.send_signal(signal.SIGTERM)
        rc = p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    left = made & _namespaces()
    for ns in left:  # do not leave them on the host when the test fails
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    assert not left, f"namespaces left after SIGTERM: {sorted(left)}"
    assert rc == 128 + signal.SIGTERM
