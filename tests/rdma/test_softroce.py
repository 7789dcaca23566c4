"""Real RDMA verbs under Soft-RoCE: dicomm's verbs transport in a QEMU guest (Debian's stock kernel,
rdma_rxe on the guest's eth0, the host's own userland and checkout over 9p). One guest session
runs everything (module-scoped, a minute or two under TCG) and the tests read its results.

Before the verbs transport is wired into the engine, traffic goes through
tests/rdma/native/verbs_pingpong.cpp: two processes driving the transport with a minimal sink.
Skips (saying why) only when QEMU or the Debian packages cannot be obtained.
"""
from __future__ import annotations

import json
import re
import subprocess

import pytest

from tests.rdma import guest, lab

SESSION_TIMEOUT_S = 600
# The first test that needs the guest waits for the whole session (build, boot, run).
pytestmark = pytest.mark.timeout(SESSION_TIMEOUT_S + 300)


@pytest.fixture(scope="module")
def bin_dir():
    try:
        lab.prepare()
    except lab.Unavailable as e:
        pytest.skip(f"Soft-RoCE lab unavailable: {e}")
    return lab.build_native()


@pytest.fixture(scope="module")
def session(bin_dir):
    rel = bin_dir.relative_to(lab.REPO) if bin_dir.is_relative_to(lab.REPO) else bin_dir
    res = guest.run(f"RDMA_BIN={rel} bash tests/rdma/guest_session.sh", timeout_s=SESSION_TIMEOUT_S)
    assert res.rc == 0, f"the guest session did not finish:\n{res.describe()}"
    print(f"\nguest session: {res.seconds:.0f} s\n{res.output}")
    return res


def _step(session, name: str) -> str:
    rc = session.files.get(f"{name}.rc", "").strip()
    text = session.files.get(f"{name}.txt", "")
    assert rc == "0", f"guest step {name} exited {rc or 'without status'}:\n{text[-3000:]}\n{session.describe()}"
    return text


def _json_line(text: str) -> dict:
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise AssertionError(f"no JSON result in:\n{text[-2000:]}")


def test_own_verbs_declarations_match_rdma_core(bin_dir):
    """dicomm declares the libibverbs ABI itself; rdma-core's header must agree field by field."""
    assert lab.abi_check() == ""


def test_host_without_rdma_says_why(bin_dir):
    """This host has no RDMA device: the transport refuses with a reason, and names the missing
    CUDA driver for the device path, instead of failing obscurely."""
    probe = subprocess.run([str(bin_dir / "verbs_pingpong"), "probe"], capture_output=True, text=True, timeout=60)
    out = json.loads(probe.stdout)
    if out["probe"]["devices"]:
        pytest.skip("this host has RDMA devices")
    assert out["probe"]["why"], out
    assert "no CUDA driver" in out["device_path_without_gpu"]
    run = subprocess.run([str(bin_dir / "verbs_pingpong"), "run", "10"], capture_output=True, text=True, timeout=60)
    assert run.returncode != 0 and "no verbs:" in run.stderr


def test_probe_finds_rxe0_and_its_roce_v2_gid(session):
    probe = _json_line(_step(session, "probe"))["probe"]
    dev = next(d for d in probe["devices"] if d["name"] == "rxe0")
    port = dev["ports"][0]
    assert port["active"] and port["link_layer"] == "Ethernet" and port["active_mtu"] >= 1024
    chosen = next(g for g in port["gids"] if g["index"] == port["chosen_gid"])
    assert chosen["type"] == "RoCE v2" and chosen["ipv4"] == "10.0.2.15" and chosen["netdev"] == "eth0"


def test_p2p_over_verbs_all_sizes_byte_exact(session):
    """0 B .. 16 MiB both ways (eager, inline, rendezvous by RDMA read, multi-chunk), verified."""
    res = _json_line(_step(session, "pingpong"))
    assert res["ok"] and res["reg_cache_hits"] > res["reg_cache_misses"]


def test_cpu_mediated_staging_path_byte_exact(session):
    """DICOMM_IB_FORCE_STAGING=1: host memory stands in for unregistrable device memory."""
    assert _json_line(_step(session, "staging"))["ok"]


def _perftest_row(text: str, cols: int) -> list[float]:
    rows = [line.split() for line in text.splitlines() if re.match(r"^\s*\d+\s+\d+\s", line)]
    assert rows, f"no result row in perftest output:\n{text[-2000:]}"
    return [float(x) for x in rows[-1][:cols]]


def test_perftest_reference_and_numbers(session):
    """perftest on the same rxe0 in the same run; the numbers go to docs/rdma.md (not asserted)."""
    lat = _perftest_row(_step(session, "write_lat"), 5)[4]       # t_typical
    bw64 = _perftest_row(_step(session, "write_bw_64k"), 4)[3]   # BW average MB/s
    bw1m = _perftest_row(_step(session, "write_bw_1m"), 4)[3]
    ours = _json_line(session.files["pingpong.txt"])
    print(f"\n{'':24}{'dicomm verbs':>14}{'perftest':>12}{'ratio':>8}")
    for name, a, b in [("8 B half RTT (us)", ours["lat_8B_us"], lat), ("64 KiB (MB/s)", ours["bw_64KiB_MBps"], bw64),
                       ("1 MiB (MB/s)", ours["bw_1MiB_MBps"], bw1m)]:
        print(f"{name:24}{a:>14.2f}{b:>12.2f}{a / b:>8.2f}")
    assert lat > 0 and bw64 > 0 and bw1m > 0
