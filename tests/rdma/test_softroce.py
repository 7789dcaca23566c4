"""Real RDMA verbs under Soft-RoCE: dicomm's verbs transport in a QEMU guest (Debian's stock kernel,
rdma_rxe on the guest's eth0, the host's own userland and checkout over 9p). One guest session
runs everything (module-scoped, a minute or two under TCG) and the tests read its results.

Two layers are checked: tests/rdma/native/verbs_pingpong.cpp drives the transport alone with a
minimal sink, and tests/rdma/guest_p2p.py runs the whole engine (Communicator, every collective, the
torch backend) with transport="verbs". The references are independent of dicomm: numpy for data,
rdma-core's pyverbs for the device view, an RDMA WRITE into dicomm's registration and a rank of
the wire protocol written from docs/rdma.md (guest_pyverbs.py, pyverbs_peer.py), perftest for
speed. Skips (saying why) only when QEMU or the Debian packages cannot be obtained.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.rdma import guest, lab, perftest

SESSION_TIMEOUT_S = 600
DRAIN_S = 20.0  # DICOMM_IB_DRAIN_MS of the close scenarios (guest_p2p.py)
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
    # 2 GiB: two ranks each hold 64 MiB messages (sent, received, expected) next to the root's tmpfs.
    res = guest.run(f"RDMA_BIN={rel} bash tests/rdma/guest_session.sh", timeout_s=SESSION_TIMEOUT_S, mem_mb=2048)
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


_NO_RDMA_ENGINE = """
import datetime, json, torch.distributed as dist, dicomm._C as C
if json.loads(C._verbs_probe())["verbs"]["devices"]:
    print("HAS-RDMA"); raise SystemExit
store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=10))
for i in range(2):  # two engines in one process: the missing device is logged once
    C.Communicator(dist.PrefixStore(str(i), store), 0, 1, 10.0, "auto").close()
try:
    C.Communicator(dist.PrefixStore("v", store), 0, 1, 10.0, "verbs")
    print("ACCEPTED")
except C.DicommError as e:
    print("REFUSED:", e)
"""


def test_engine_without_rdma_logs_once_and_refuses_forced_verbs():
    """No silent fallback: auto says once (at info) why there is no verbs transport; verbs forced
    on a host without RDMA is an error naming why."""
    env = dict(os.environ, DICOMM_LOG_LEVEL="info")
    env.pop("DICOMM_TRANSPORT", None)
    p = subprocess.run([sys.executable, "-c", _NO_RDMA_ENGINE], capture_output=True, text=True, timeout=120, env=env)
    if "HAS-RDMA" in p.stdout:
        pytest.skip("this host has RDMA devices")
    assert p.returncode == 0, p.stderr
    assert p.stderr.count("no RDMA verbs transport") == 1, p.stderr
    assert "REFUSED:" in p.stdout and "has no usable RDMA device" in p.stdout, p.stdout


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


def test_channel_constructor_failing_part_way_leaks_nothing(session):
    """The kernel's rdma cgroup limit refuses the device's next object, so a verbs Channel's
    constructor throws after registering its control memory, after making its completion queue,
    and after that, at its queue pair; each time the kernel's count of the process's device objects
    (rdma.current) and its open descriptors (the side channel it was handed included) are back where
    they were. With room for all of them the channel is made, and released on destruction."""
    res = _json_line(_step(session, "channel_limits"))
    tries = res["tries"]
    errors = [t["error"] for t in tries if not t["made"]]
    for step in ("registering control memory", "creating a completion queue", "creating an RC queue pair"):
        assert any(step in e for e in errors), (step, tries)
    assert tries[-1]["made"] and tries[-1]["objects_while_made"] >= 3, tries
    assert all(t["objects_left"] == 0 and t["fds_left"] == 0 for t in tries), tries


def _scenario(session, name: str, step: str = "p2p"):
    """One scenario of guest_p2p.py (its step may exit non-zero: each scenario says for itself)."""
    text = session.files.get(f"{step}.txt", "")
    assert text, f"guest_p2p.py ({step}) did not run:\n{session.describe()}"
    entry = _json_line(text).get(name)
    assert entry and entry["ok"], f"guest_p2p scenario {name}:\n{(entry or {}).get('error', text[-3000:])}"
    return entry["result"]


def _port_summary(probe: dict) -> list:
    """What cannot change during a run (IPv6 GIDs appear as the guest's interface configures)."""
    out = []
    for d in probe["devices"]:
        for p in d["ports"]:
            chosen = next((g for g in p["gids"] if g["index"] == p["chosen_gid"]), {})
            out.append((d["name"], p["port"], p["active"], p["active_mtu"], chosen.get("gid"), chosen.get("ipv4")))
    return out


def test_verbs_probe_binding_agrees_with_the_transport(session):
    ours = _scenario(session, "probe")
    summary = _port_summary(ours["verbs"])
    assert summary == _port_summary(_json_line(_step(session, "probe"))["probe"])
    assert ("rxe0", 1, True, 1024, "0000:0000:0000:0000:0000:ffff:0a00:020f", "10.0.2.15") in summary, summary
    assert ours["accelerator"]["path"] == "cpu-mediated" and "no CUDA driver" in ours["accelerator"]["why"]


def test_verbs_probe_reads_the_settings_it_is_given(session):
    """_verbs_probe(settings) chooses as a communicator given those settings would: GID index 0 when
    told so, and an entry it cannot use (97) named with the GID table instead of a choice."""
    res = _scenario(session, "probe_settings")
    port97 = next(d for d in res["gid_97"]["devices"] if d["name"] == "rxe0")["ports"][0]
    assert port97["chosen_gid"] == -1 and "DICOMM_IB_GID_INDEX=97" in port97["chosen_why"], port97
    assert "GID table" in port97["chosen_why"], port97
    port0 = next(d for d in res["gid_0"]["devices"] if d["name"] == "rxe0")["ports"][0]
    assert port0["chosen_gid"] == 0 and port0["chosen_why"] == "DICOMM_IB_GID_INDEX=0", port0


def test_verbs_probe_refuses_a_bad_setting_by_name():
    """Settings are checked as a communicator checks them, on any host (no device needed)."""
    import dicomm._C as C

    with pytest.raises(ValueError, match="DICOMM_IB_SLOTS"):
        C._verbs_probe({"DICOMM_IB_SLOTS": "many"})
    with pytest.raises(ValueError, match="DICOMM_NO_SUCH_KNOB"):
        C._verbs_probe({"DICOMM_NO_SUCH_KNOB": "1"})


ALL_COLLECTIVES = ["all_reduce", "reduce", "all_gather", "gather", "scatter", "reduce_scatter", "all_to_all",
                   "broadcast", "barrier"]


@pytest.mark.parametrize("world", [2, 3, 4])
def test_communicator_over_verbs_p2p_and_collectives(session, world):
    """A ring of 0 B .. 64 MiB (2 ranks; .. 8 KiB with 3, .. 1 MiB with 4) byte for byte, then every
    collective against numpy, all with transport="verbs"."""
    ranks = _scenario(session, f"p2p_{world}")
    for r, res in enumerate(ranks):
        assert res["collectives"] == ALL_COLLECTIVES, (r, res["collectives"])
        for peer in {(r + 1) % world, (r - 1) % world}:
            assert res["paths"][peer] == "verbs", (r, res["paths"])
        assert res["stats"]["verbs_peers"] >= 1 and res["stats"]["verbs_reg_cache_misses"] >= 1, res["stats"]


def test_torch_backend_over_verbs(session):
    """dist.init_process_group("dicomm") with DICOMM_TRANSPORT=verbs: send/recv and all_reduce."""
    assert [r["path"] for r in _scenario(session, "torch_backend")] == ["verbs", "verbs"]


def test_closing_peer_neither_stalls_nor_loses_its_last_message(session):
    """The drain bound is 20 s in these scenarios: a close that waited for credit writes, or for a peer
    that had torn its queue pair down, took all of it (under the engine lock: the survivor's next
    receive waited too)."""
    first, second = _scenario(session, "close_in_order")
    assert second["last_message_ok"]
    # Half the drain bound: waiting it out fails, a guest slowed by a loaded host does not.
    bound = DRAIN_S / 2
    assert second["recv_s"] < bound, second
    both = _scenario(session, "close_together")
    for rank in (first, second, *both):
        assert rank["close_s"] + rank["drop_s"] < bound, (first, second, both)


def test_peer_killed_mid_transfer_is_a_peer_error_not_a_hang(session):
    res = _scenario(session, "killed_peer")
    assert all(t["whole"] for t in res["tries"] if t.get("completed")), res["tries"]  # each such try was whole
    if res.get("completed"):
        pytest.skip(f"this guest moved 64 MiB before its sender was killed, in every try: {res['tries']}")
    assert res.get("kind") == "PeerError", res
    assert res["seconds"] < 20 and "rank 0" in res["text"], res


def test_matched_receive_withdrawn_at_its_timeout_leaves_the_buffer_alone(session):
    """A 128 MiB receive times out while its RDMA reads are under way (the scenario tries several
    deadlines until one passes mid-transfer, as the guest's speed varies; where none does, the test
    skips, listing the tries): the reads already posted are
    awaited and no further one is posted, so once the TimeoutError is raised the buffer is the
    user's (unchanged 4 s later, while the whole transfer would have needed longer); the sender's
    send fails as timed out, and the next messages on the connection arrive intact."""
    receiver = _scenario(session, "matched_timeout")[1]
    sender = _scenario(session, "matched_timeout")[0]
    assert receiver["next_ok"] == [True, True], receiver
    assert all(t.get("changed_after", 0) == 0 for t in receiver["tries"]), receiver["tries"]
    if not receiver.get("mid_transfer"):
        pytest.skip(f"this guest moved 128 MiB before any deadline passed mid-transfer: {receiver['tries']}")
    assert "never written again" in receiver["text"], receiver
    assert 0 < receiver["written_before"] < receiver["bytes"] * 0.98, receiver  # it did time out mid-transfer
    assert receiver["changed_after"] == 0, receiver
    assert receiver["next_ok"] == [True, True], receiver
    assert sender["first_send"].startswith("TimeoutError") and "discarded" in sender["first_send"], sender


def test_port_going_down_fails_waiting_receives_with_peer_error(session):
    """The interface under rxe0 taken down while both ranks wait on a receive: the device's port error
    event (no completion comes) must fail both with PeerError long before their 30 s, naming the
    event; a send to the lost peer then fails at once."""
    ranks = _scenario(session, "port_down", step="port_down")
    for rank, res in enumerate(ranks):
        assert res.get("kind") == "PeerError", (rank, res)
        assert res["seconds"] < 10 and "port error" in res["text"] and "rxe0 port 1" in res["text"], (rank, res)
        # "At once": a quarter of the 30 s the send would otherwise wait (a loaded host slows the guest).
        assert res["send_after"] == "PeerError" and res["send_after_s"] < 30 / 4, (rank, res)


def test_freed_and_reused_buffer_is_registered_again(session):
    """A 4 MiB mapping sent and received (so registered and cached), unmapped, and mapped again at
    the same address with other bytes: the second transfer must carry the new bytes, not the old
    pages the cached registration still pins."""
    for rank, res in enumerate(_scenario(session, "reused_address")):
        assert res["rounds_ok"] == [True, True], (rank, res)
        assert res["address_reused"], f"rank {rank}: the kernel did not hand back the same address: {res}"


def test_buffer_remapped_in_the_middle_is_registered_again(session):
    """One page in the middle of a cached 4 MiB send and receive buffer mapped anew (first and last
    pages kept): the second transfer must carry the new bytes, and the cache must say it found both
    registrations stale."""
    for rank, res in enumerate(_scenario(session, "middle_page")):
        assert res["rounds_ok"] == [True, True], (rank, res)
        assert res["stale_registrations"] == 2, (rank, res)


def test_wrong_gid_index_names_device_port_and_gid(session):
    res = _scenario(session, "bad_gid")
    assert "DICOMM_IB_GID_INDEX=97" in res.get("text", ""), res
    assert "rxe0 port 1" in res["text"] and "GID table" in res["text"], res


def test_peer_of_another_wire_version_is_refused_by_name(session):
    """Verbs connection data of wire version 99 after a valid handshake: rank 0 refuses it with a
    warning naming both versions, answers with its own version (2) and hangs up; its traffic with
    the real rank 1 goes on."""
    rank0, rank1 = _scenario(session, "wrong_wire_version")
    assert rank1["accepted"] and rank1["closed"], rank1
    assert rank1["reply_magic"] == 0x56434944 and rank1["reply_version"] == 2, rank1
    assert rank0["rejected"] == 1 and rank0["message_ok"], rank0
    assert any("wire version 99" in w and "version 2" in w for w in rank0["warnings"]), rank0


def test_ranks_with_different_eager_sizes_are_refused_naming_both(session):
    """Rank 1 given DICOMM_IB_EAGER_BYTES=4096 as its setting, rank 0 the default 8192: the receive
    slots would not fit the other's SENDs, so the connection is refused before any queue pair
    connects. The connecting rank's send fails with PeerError and the accepting rank warns, both
    naming the two values."""
    rank0, rank1 = _scenario(session, "eager_mismatch")
    for text in (rank1["send_error"], *rank0["warnings"]):
        assert "DICOMM_IB_EAGER_BYTES=4096" in text and "DICOMM_IB_EAGER_BYTES=8192" in text, (rank0, rank1)
    assert rank1["send_kind"] == "PeerError", rank1
    assert rank0["rejected"] >= 1 and rank0["warnings"], rank0


def test_two_communicators_of_one_process_keep_their_own_verbs_settings(session):
    """DICOMM_IB_EAGER_BYTES=0 given to one communicator as its setting: its 4 KiB messages go by
    rendezvous (its registration cache misses), while another communicator of the same processes
    sends them eagerly (no registration); both deliver the bytes."""
    for rank, res in enumerate(_scenario(session, "settings_per_communicator")):
        assert res["intact"] == {"eager_0": True, "default": True}, (rank, res)
        assert res["misses"]["eager_0"] >= 1 and res["misses"]["default"] == 0, (rank, res)


def test_a_communicator_with_a_wrong_gid_setting_fails_alone(session):
    res = _scenario(session, "gid_setting")
    assert "DICOMM_IB_GID_INDEX=97" in res["text"] and "GID table" in res["text"], res
    assert res["other_ok"], res


def test_pyverbs_sees_what_the_probe_reports(session):
    """rdma-core's pyverbs reads rxe0's name, port state, active MTU and GID table; dicomm's
    _verbs_probe() must report the same."""
    res = _json_line(_step(session, "pyverbs_probe"))
    assert res["ok"] and not res.get("unstable"), res
    theirs = {d["name"]: d for d in res["pyverbs"]}
    assert "rxe0" in theirs, res["pyverbs"]
    for dev in res["dicomm"]["devices"]:
        pv = theirs[dev["name"]]
        port = next(p for p in dev["ports"] if p["port"] == pv["port"])
        assert port["active"] == pv["active"] and port["active_mtu"] == pv["active_mtu"], (port, pv)
        ours = sorted((g["index"], g["gid"]) for g in port["gids"])
        assert ours == sorted((g["index"], g["gid"]) for g in pv["gids"]), (ours, pv["gids"])
    assert set(theirs) == {d["name"] for d in res["dicomm"]["devices"]}


@pytest.mark.parametrize("size", ["8", "1m"])
def test_pyverbs_rdma_write_lands_in_dicomm_registered_buffer(session, size):
    """A pyverbs queue pair RDMA-WRITEs its pattern into a buffer registered by dicomm's
    registration cache, connected to dicomm's queue pair (address, rkey and QP data exchanged
    through files); dicomm's side finds every byte."""
    res = _json_line(_step(session, f"pyverbs_write_{size}"))
    assert res["ok"] and res["mismatched"] == 0 and res["target_exit"] == 0, res


def test_pyverbs_peer_exchanges_messages_with_the_transport(session):
    """A rank written with pyverbs from docs/rdma.md's wire protocol alone (pyverbs_peer.py) and
    dicomm's verbs transport exchange one message each way per size: eager up to 8 KiB, rendezvous
    above (pyverbs RDMA-reads dicomm's registered send buffers, dicomm reads pyverbs' into its
    registered receive buffers); bytes, tag and meta checked on both sides."""
    res = _json_line(_step(session, "pyverbs_exchange"))
    assert res["ok"] and res["target_exit"] == 0, res
    ours, theirs = res["dicomm"]["received"], res["pyverbs_received"]
    sizes = [r["bytes"] for r in theirs]
    assert sizes == [r["bytes"] for r in ours] and max(sizes) > 4 << 20, res
    assert all(r["ok"] and r["mismatched"] == 0 for r in ours + theirs), res
    assert all(r["tag"] == 2 * i + 1 and r["meta_ok"] for i, r in enumerate(ours)), ours
    assert [r["sent_as"] for r in theirs] == ["eager" if n <= 8192 else "rendezvous" for n in sizes], theirs
    assert res["pyverbs_read_bytes"] == sum(n for n in sizes if n > 8192), res


def test_pyverbs_peer_of_another_wire_version_is_refused(session):
    """The pyverbs rank offers wire version 99 after a valid handshake: dicomm answers with its own
    magic and version, hangs up, and names both versions."""
    res = _json_line(_step(session, "pyverbs_exchange"))
    assert res["wrong_version"] == {"reply_magic": 0x56434944, "reply_version": 2, "reply_eager_bytes": 8192,
                                    "closed": True}, res
    assert any("wire version 99" in w and "version 2" in w for w in res["dicomm"]["rejected"]), res


def test_pyverbs_peer_of_another_eager_size_is_refused(session):
    """The pyverbs rank offers wire version 2 with 4096 B eager messages to dicomm's 8192: dicomm
    answers with its magic, version and eager size, hangs up, and names both sizes."""
    res = _json_line(_step(session, "pyverbs_exchange"))
    assert res["wrong_eager"] == {"reply_magic": 0x56434944, "reply_version": 2, "reply_eager_bytes": 8192,
                                  "closed": True}, res
    assert any("DICOMM_IB_EAGER_BYTES=4096" in w and "DICOMM_IB_EAGER_BYTES=8192" in w
               for w in res["dicomm"]["rejected"]), res


def test_perftest_reference_and_numbers(session):
    """perftest on the same rxe0 in the same run; the numbers go to docs/rdma.md (not asserted)."""
    lat = perftest.lat_typical_us(_step(session, "write_lat"))
    bw64 = perftest.bw_average_mibps(_step(session, "write_bw_64k"))
    bw1m = perftest.bw_average_mibps(_step(session, "write_bw_1m"))
    ours = _json_line(session.files["pingpong.txt"])
    print(f"\n{'':24}{'dicomm verbs':>14}{'perftest':>12}{'ratio':>8}")
    rows = [("8 B half RTT (us)", ours["lat_8B_us"], lat), ("64 KiB (MiB/s)", ours["bw_64KiB_MiBps"], bw64),
            ("1 MiB (MiB/s)", ours["bw_1MiB_MiBps"], bw1m)]
    p2p_lines = reversed(session.files.get("p2p.txt", "").splitlines())
    p2p = json.loads(next((ln for ln in p2p_lines if ln.startswith("{")), "{}"))
    if p2p.get("p2p_2", {}).get("ok"):  # the same through the Communicator (engine + Python)
        comm = p2p["p2p_2"]["result"][0]
        rows += [("Communicator 8 B (us)", comm["lat_8B_us"], lat), ("Communicator 1 MiB", comm["bw_1MiB_MiBps"], bw1m)]
    if p2p.get("latency_spin_100us", {}).get("ok"):
        comm = p2p["latency_spin_100us"]["result"][0]
        rows += [("  spin 100 us: 8 B (us)", comm["lat_8B_us"], lat),
                 ("  spin 100 us: 1 MiB", comm["bw_1MiB_MiBps"], bw1m)]
    for name, a, b in rows:
        print(f"{name:24}{a:>14.2f}{b:>12.2f}{a / b:>8.2f}")
    assert lat > 0 and bw64 > 0 and bw1m > 0
