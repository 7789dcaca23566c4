"""Two emulated clusters on this machine (tests and benchmarks): one network namespace per cluster, joined by a
veth pair whose both ends are shaped with `tc` (the cross-cluster link's rate). Ranks run inside their
cluster's namespace (`ip netns exec`), so the only traffic between clusters crosses that link, on
addresses of namespaces created here. Needs root, `ip` and `tc`; `two_clusters` raises Unavailable with
the reason otherwise. Delay shaping (netem) is used when the kernel has it, else a token bucket (tbf) whose
bucket holds about a millisecond of traffic (link_burst_bytes): a bucket as large as a message would let that
message pass at memory speed, so the ranks would not see a link of the rate the cluster spec prices. The two
ends take the first two host addresses of a subnet: `subnet=`, else $HETEROPP_NETNS_SUBNET, else a 10.x.y.0/24
picked from the pid (choose one where it would clash with a network of this host)."""
from __future__ import annotations

import contextlib
import ipaddress
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from heteropp.engine.config import RunConfig


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


SUBNET_ENV = "HETEROPP_NETNS_SUBNET"
_RATE_UNITS = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
_FRAME_BYTES = 1514  # the largest Ethernet frame on the veth (MTU 1500 and its header): the bucket must hold one


def rate_bytes_s(rate: str) -> float:
    """A tc rate written as a number and kbit, mbit or gbit, in bytes per second; ValueError otherwise."""
    for unit, scale in _RATE_UNITS.items():
        if rate.endswith(unit):
            try:
                value = float(rate[: -len(unit)])
            except ValueError:
                break
            if value > 0:
                return value * scale / 8
    raise ValueError(f"expected a positive rate such as 50mbit or 1gbit, got {rate!r}")


def wire_bytes(payload: int) -> int:
    """What a message of `payload` bytes costs a shaped link over TCP: its bytes and a header per full frame
    (Ethernet 14, IPv4 20, TCP with timestamps 32 bytes, so 1448 payload bytes a frame): about 4.6% more."""
    mss = _FRAME_BYTES - 14 - 20 - 32
    return payload + -(-payload // mss) * (_FRAME_BYTES - mss)


def link_burst_bytes(rate: str) -> int:
    """The token bucket of a link shaped to `rate`: a millisecond of traffic, at least two full frames. A message
    then takes its bytes over the rate to within a millisecond, as on a link of that rate."""
    return max(round(rate_bytes_s(rate) / 1000), 2 * _FRAME_BYTES)


def end_addresses(subnet: str | None = None) -> tuple[str, str, int]:
    """The two ends' addresses and the prefix length: the first two hosts of `subnet` (IPv4, CIDR, at least
    two hosts), of $HETEROPP_NETNS_SUBNET when not given, else of a 10.x.y.0/24 picked from the pid."""
    where = "subnet" if subnet is not None else SUBNET_ENV
    subnet = subnet if subnet is not None else os.environ.get(SUBNET_ENV)
    if subnet is None:
        subnet = f"10.{200 + os.getpid() % 50}.{os.getpid() % 250}.0/24"
    try:
        net = ipaddress.IPv4Network(subnet, strict=False)
    except ValueError as e:
        raise ValueError(f"{where}: {subnet!r} is not an IPv4 network ({e}); expected CIDR such as "
                         "10.201.7.0/24") from None
    hosts = list(itertools.islice(net.hosts(), 2))
    if len(hosts) < 2 or net.prefixlen > 30:
        raise ValueError(f"{where}: {subnet!r} has fewer than two host addresses; expected a prefix of /30 or "
                         "shorter")
    return str(hosts[0]), str(hosts[1]), net.prefixlen


@contextlib.contextmanager
def two_clusters(rate: str = "1gbit", delay: str = "1ms", subnet: str | None = None,
                 burst: int | None = None) -> Iterator[tuple[Cluster, Cluster, bool]]:
    """(cluster A, cluster B, whether the delay could be emulated); the namespaces are removed on exit.
    `subnet`: the link's addresses (end_addresses); `burst`: the token bucket's bytes where tbf shapes
    (default link_burst_bytes(rate); bench.heteropp_link_probe compares others)."""
    first, second, prefix = end_addresses(subnet)
    if os.geteuid() != 0:
        raise Unavailable("network namespaces need root")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise Unavailable(f"`{tool}` is not installed")
    tag = f"{os.getpid() % 100000}"
    a = Cluster(f"hpA{tag}", f"hpa{tag}", first)
    b = Cluster(f"hpB{tag}", f"hpb{tag}", second)
    made: list[str] = []
    previous = _exit_on_sigterm()
    try:
        for c in (a, b):
            _ip("netns", "add", c.netns)
            made.append(c.netns)
        _ip("link", "add", a.ifname, "type", "veth", "peer", "name", b.ifname)
        delayed = True
        for c in (a, b):
            _ip("link", "set", c.ifname, "netns", c.netns)
            _ip("-n", c.netns, "addr", "add", f"{c.address}/{prefix}", "dev", c.ifname)
            _ip("-n", c.netns, "link", "set", c.ifname, "up")
            _ip("-n", c.netns, "link", "set", "lo", "up")
            if not _tc(c.netns, "qdisc", "add", "dev", c.ifname, "root", "netem", "delay", delay, "rate", rate):
                delayed = False
                if not _tc(c.netns, "qdisc", "add", "dev", c.ifname, "root", "tbf", "rate", rate, "burst",
                           str(burst or link_burst_bytes(rate)), "latency", "1s"):  # a queue of a second: no drops
                    raise Unavailable("tc can shape neither with netem nor with tbf here")
        yield a, b, delayed
    finally:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _exit_on_sigterm():
    """SIGTERM (`timeout`, a scheduler) raises SystemExit, so the namespaces are removed on the way out; the
    default action would end the interpreter without cleanup. Returns the handler to restore (None off the main
    thread, where Python cannot install one)."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def stop(signum, _frame):
        raise SystemExit(128 + signum)
    return signal.signal(signal.SIGTERM, stop)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tx_bytes(c: Cluster) -> int:
    """Bytes the cluster's end of the link has sent."""
    r = subprocess.run(["ip", "netns", "exec", c.netns, "cat", f"/sys/class/net/{c.ifname}/statistics/tx_bytes"],
                       capture_output=True, text=True, check=True)
    return int(r.stdout)


def run_across(workdir: Path, cfg: RunConfig, clusters: tuple[Cluster, Cluster, bool],
               env_extra: dict[str, str] | None = None) -> dict[str, list[dict]]:
    """Runs `cfg` with each stage's ranks in its chip type's namespace (the plan's first chip type in the first
    cluster, every other in the second); returns the lead rank's per-step lines per schedule (loss, tokens/s)."""
    a, b, _ = clusters
    plan = cfg.plan_obj
    first = plan.stages[0].chip
    path = workdir / "run.json"
    path.write_text(json.dumps(cfg.__dict__))
    port, procs = _free_port(), []
    offs = plan.rank_offsets()
    for k, st in enumerate(plan.stages):
        c = a if st.chip == first else b
        for r in range(offs[k], offs[k] + plan.stage_ranks(k)):
            env = {**os.environ, "RANK": str(r), "WORLD_SIZE": str(plan.world_size), "MASTER_ADDR": a.address,
                   "MASTER_PORT": str(port), "GLOO_SOCKET_IFNAME": c.ifname, "OMP_NUM_THREADS": "1",
                   **(env_extra or {})}
            procs.append(subprocess.Popen(["ip", "netns", "exec", c.netns, sys.executable, "-m",
                                           "heteropp.engine.worker", "--config", str(path)], env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=600)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError("a rank failed:\n" + "\n".join(outs)[-3000:])
    steps: dict[str, list[dict]] = {}
    for line in "\n".join(outs).splitlines():
        if line.startswith("[") and "tokens/s" in line:
            label, rest = line[1:].split("]", 1)
            f = rest.split()
            steps.setdefault(label, []).append({"loss": float(f[3]), "tokens_per_s": float(f[4])})
    return steps
