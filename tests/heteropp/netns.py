"""Two emulated clusters on this machine: one network namespace per cluster, joined by a veth pair whose
both ends are shaped with `tc` (token bucket: the cross-cluster link's rate). Ranks run inside their
cluster's namespace (`ip netns exec`), so the only traffic between clusters crosses that link, on
addresses of namespaces created here. Needs root, `ip` and `tc`; `two_clusters` raises Unavailable with
the reason otherwise. Delay shaping (netem) is used when the kernel has it."""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from typing import Iterator


class Unavailable(RuntimeError):
    """Why the emulated network cannot be set up here."""


@dataclass(frozen=True)
class Cluster:
    netns: str
    ifname: str
    address: str


def _ip(*args: str) -> None:
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    if r.returncode:
        raise Unavailable(f"`ip {' '.join(args)}` failed: {r.stderr.strip()}")


def _tc(ns: str, *args: str) -> bool:
    return subprocess.run(["ip", "netns", "exec", ns, "tc", *args], capture_output=True).returncode == 0


@contextlib.contextmanager
def two_clusters(rate: str = "1gbit", delay: str = "1ms") -> Iterator[tuple[Cluster, Cluster, bool]]:
    """(cluster A, cluster B, whether the delay could be emulated); the namespaces are removed on exit."""
    if os.geteuid() != 0:
        raise Unavailable("network namespaces need root")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise Unavailable(f"`{tool}` is not installed")
    tag = f"{os.getpid() % 100000}"
    net = f"10.{200 + os.getpid() % 50}.{os.getpid() % 250}"
    a = Cluster(f"hpA{tag}", f"hpa{tag}", f"{net}.1")
    b = Cluster(f"hpB{tag}", f"hpb{tag}", f"{net}.2")
    made: list[str] = []
    try:
        for c in (a, b):
            _ip("netns", "add", c.netns)
            made.append(c.netns)
        _ip("link", "add", a.ifname, "type", "veth", "peer", "name", b.ifname)
        delayed = True
        for c in (a, b):
            _ip("link", "set", c.ifname, "netns", c.netns)
            _ip("-n", c.netns, "addr", "add", f"{c.address}/24", "dev", c.ifname)
            _ip("-n", c.netns, "link", "set", c.ifname, "up")
            _ip("-n", c.netns, "link", "set", "lo", "up")
            if not _tc(c.netns, "qdisc", "add", "dev", c.ifname, "root", "netem", "delay", delay, "rate", rate):
                delayed = False
                if not _tc(c.netns, "qdisc", "add", "dev", c.ifname, "root", "tbf", "rate", rate, "burst", "256kb",
                           "latency", "100ms"):
                    raise Unavailable("tc can shape neither with netem nor with tbf here")
        yield a, b, delayed
    finally:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
