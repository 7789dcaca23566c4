"""pyverbs (rdma-core's own Python binding) as an independent reference, inside the Soft-RoCE guest.

  probe            rxe0's name, port state, active MTU and GID table as pyverbs reads them, next to
                   what dicomm._C._verbs_probe() reports (compared by test_softroce.py)
  write N DIR BIN  a pyverbs RC queue pair RDMA-WRITEs N bytes into a buffer that dicomm registered
                   (BIN write-target N DIR: dicomm's registration cache and queue pair); address,
                   rkey and queue pair data go through files in DIR. dicomm's side checks the bytes.
  exchange DIR BIN a rank written with pyverbs from the documented wire protocol (pyverbs_peer.py)
                   and dicomm's verbs transport (BIN exchange: the transport with a minimal sink)
                   exchange one message each way per size of EXCHANGE_SIZES, eager and rendezvous
                   (RDMA READs from and into dicomm's registered buffers); both sides check every byte.
                   Then the peer offers wire version 99, then 4096 B eager messages: dicomm must
                   answer each with its own and hang up.
Prints one JSON line.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

sys.path.append("/usr/lib/python3/dist-packages")  # Debian's python3-pyverbs (the venv does not see it)

from pyverbs import enums as e  # noqa: E402
from pyverbs.addr import AHAttr, GlobalRoute  # noqa: E402
from pyverbs.cq import CQ  # noqa: E402
from pyverbs.device import Context, get_device_list  # noqa: E402
from pyverbs.mr import MR  # noqa: E402
from pyverbs.pd import PD  # noqa: E402
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr  # noqa: E402
from pyverbs.wr import SGE, SendWR  # noqa: E402

PORT = 1


def _gid_text(raw: str) -> str:
    """pyverbs prints a GID as 8 groups of 4 hex digits, like sysfs; normalised to that form."""
    h = raw.replace(":", "").lower()
    return ":".join(h[i:i + 4] for i in range(0, 32, 4))


def read_devices() -> list[dict]:
    out = []
    for dev in get_device_list():
        name = dev.name.decode()
        ctx = Context(name=name)
        pa = ctx.query_port(PORT)
        # ibv_query_gid_table lists the valid entries in one call (querying each of rxe's 1024
        # indices one by one takes tens of seconds under TCG); each is then read with ibv_query_gid.
        valid = sorted(g.gid_index for g in ctx.query_gid_table(pa.gid_tbl_len) if g.port_num == PORT)
        gids = [{"index": i, "gid": _gid_text(str(ctx.query_gid(PORT, i)))} for i in valid]
        out.append({"name": name, "port": PORT, "active": pa.state == e.IBV_PORT_ACTIVE,
                    "active_mtu": 128 << int(pa.active_mtu), "gids": gids})
        ctx.close()
    return out


def probe() -> dict:
    """pyverbs before and after dicomm's probe: the GID table may grow (IPv6) while the guest
    configures its interface, so the comparison uses a read that pyverbs saw unchanged around it."""
    import dicomm._C as C

    for _ in range(3):
        before = read_devices()
        ours = json.loads(C._verbs_probe())["verbs"]
        after = read_devices()
        if before == after:
            return {"pyverbs": before, "dicomm": ours}
        time.sleep(1)
    return {"pyverbs": after, "dicomm": ours, "unstable": True}


def _pattern(n: int) -> bytes:  # the same rule as peer_byte() in native/verbs_pingpong.cpp
    return bytes(((i * 7 + 13 + (i >> 8)) & 0xFF) for i in range(n))


def _wait(path: str, seconds: float) -> None:
    end = time.monotonic() + seconds
    while not os.path.exists(path):
        if time.monotonic() > end:
            raise TimeoutError(f"{path} did not appear within {seconds} s")
        time.sleep(0.05)


def _v2_ipv4_gid(ctx: Context) -> int:
    """pyverbs' own choice of source GID: the RoCE v2 IPv4-mapped entry."""
    pa = ctx.query_port(PORT)
    for i in sorted(g.gid_index for g in ctx.query_gid_table(pa.gid_tbl_len) if g.port_num == PORT):
        try:
            g = _gid_text(str(ctx.query_gid(PORT, i)))
            v2 = ctx.query_gid_type(PORT, i) == e.IBV_GID_TYPE_SYSFS_ROCE_V2
        except Exception:
            continue
        if v2 and g.startswith("0000:0000:0000:0000:0000:ffff:"):
            return i
    raise RuntimeError("no RoCE v2 IPv4-mapped GID on port 1")


def write(n: int, folder: str, target_bin: str) -> dict:
    target = subprocess.Popen([target_bin, "write-target", str(n), folder], stdout=subprocess.PIPE, text=True)
    try:
        _wait(os.path.join(folder, "target.json"), 60)
        t = json.load(open(os.path.join(folder, "target.json")))
        ctx = Context(name="rxe0")
        pd, cq = PD(ctx), CQ(ctx, 8)
        qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=QPCap(max_send_wr=4, max_recv_wr=4)))
        mr = MR(pd, n, e.IBV_ACCESS_LOCAL_WRITE)
        mr.write(_pattern(n), n)
        sgid = _v2_ipv4_gid(ctx)
        mine_gid = _gid_text(str(ctx.query_gid(PORT, sgid))).replace(":", "")
        psn = 0x1234
        mtu = min(int(ctx.query_port(PORT).active_mtu), int(t["mtu"]))
        tmp = os.path.join(folder, "peer.json.tmp")
        json.dump({"qpn": qp.qp_num, "psn": psn, "mtu": mtu, "gid": mine_gid}, open(tmp, "w"))
        os.rename(tmp, os.path.join(folder, "peer.json"))
        _wait(os.path.join(folder, "ready"), 60)
        from pyverbs.addr import GID
        gr = GlobalRoute(dgid=GID(":".join(t["gid"][i:i + 4] for i in range(0, 32, 4))), sgid_index=sgid)
        attr = QPAttr(qp_state=e.IBV_QPS_INIT, cur_qp_state=e.IBV_QPS_RESET)
        attr.qp_access_flags = 0
        attr.pkey_index, attr.port_num = 0, PORT
        qp.to_init(attr)
        attr = QPAttr()
        attr.path_mtu, attr.dest_qp_num, attr.rq_psn = mtu, t["qpn"], t["psn"]
        attr.max_dest_rd_atomic, attr.min_rnr_timer = 1, 12
        attr.ah_attr = AHAttr(gr=gr, is_global=1, port_num=PORT)
        qp.to_rtr(attr)
        attr.timeout, attr.retry_cnt, attr.rnr_retry, attr.sq_psn, attr.max_rd_atomic = 14, 7, 7, psn, 1
        qp.to_rts(attr)
        wr = SendWR(opcode=e.IBV_WR_RDMA_WRITE, num_sge=1, sg=[SGE(mr.buf, n, mr.lkey)],
                    send_flags=e.IBV_SEND_SIGNALED)
        wr.set_wr_rdma(int(t["rkey"]), int(t["addr"]))
        qp.post_send(wr)
        end, done = time.monotonic() + 30, None
        while done is None and time.monotonic() < end:
            npolled, wcs = cq.poll()
            done = wcs[0] if npolled > 0 else None
        if done is None:
            raise TimeoutError("the RDMA WRITE did not complete within 30 s")
        if done.status != e.IBV_WC_SUCCESS:
            raise RuntimeError(f"the RDMA WRITE completed with status {done.status}")
        open(os.path.join(folder, "written"), "w").write("1\n")
        out, _ = target.communicate(timeout=60)
        res = json.loads(out.strip().splitlines()[-1])
        res.update({"target_exit": target.returncode, "pyverbs_sgid_index": sgid, "target_gid_index": t["gid_index"]})
        return res
    finally:
        if target.poll() is None:
            target.kill()
            target.wait()


# Eager (up to 8192 B, the documented default) and rendezvous sizes; 4 MiB + 5 takes several reads of
# either side's chunk, with reads in flight.
EXCHANGE_SIZES = [0, 1, 24, 4096, 8192, 8193, 65537, (1 << 20) + 3, (4 << 20) + 5]


def _exchange_bytes(n: int, seed: int) -> bytes:
    """Message `seed`'s bytes: byte j is ((j + seed) % 251 * 7 + 13) & 0xFF (a period that no chunk
    size divides, so a misplaced chunk shows)."""
    period = bytes((k * 7 + 13) & 0xFF for k in range(251))
    start = seed % 251
    return (period * ((start + n) // 251 + 1))[start:start + n]


def _exchange_meta(n: int) -> int:
    return (n << 8) | 0x5A


def exchange(folder: str, target_bin: str) -> dict:
    import socket

    from tests.rdma import pyverbs_peer as peer

    sizes = ",".join(map(str, EXCHANGE_SIZES))
    target = subprocess.Popen([target_bin, "exchange", folder, sizes], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    conns = []
    try:
        _wait(os.path.join(folder, "dicomm.json"), 60)
        theirs = json.load(open(os.path.join(folder, "dicomm.json")))
        host = theirs["address"].split(":")[0]
        key = bytes.fromhex(theirs["token"])
        ctx = Context(name="rxe0")
        pd = PD(ctx)
        listener = socket.create_server((host, 0))
        tmp = os.path.join(folder, "peer.json.tmp")
        json.dump({"address": f"{host}:{listener.getsockname()[1]}/rxe0:{PORT}"}, open(tmp, "w"))
        os.rename(tmp, os.path.join(folder, "peer.json"))
        deadline = time.monotonic() + 150
        send = peer.connect_to(ctx, pd, theirs["address"], key, 1, 0, deadline)
        conns.append(send)
        recv = peer.accept_from(ctx, pd, listener, key, 1, 2)
        conns.append(recv)
        rows = []
        for i, n in enumerate(EXCHANGE_SIZES):
            m = recv.receive(deadline)
            want = _exchange_bytes(n, 2 * i)
            got_ok = m.tag == 2 * i and m.meta == _exchange_meta(n) and m.data == want
            mismatched = sum(a != b for a, b in zip(m.data, want)) + abs(len(m.data) - n) if not got_ok else 0
            how = send.send_message(_exchange_bytes(n, 2 * i + 1), 2 * i + 1, _exchange_meta(n), i + 1, deadline)
            rows.append({"bytes": n, "ok": got_ok, "mismatched": mismatched, "sent_as": how})
        version = peer.try_wire_info(theirs["address"], key, 1, 0, 99, peer.EAGER_BYTES, deadline)
        eager = peer.try_wire_info(theirs["address"], key, 1, 0, peer.WIRE_VERSION, 4096, deadline)
        open(os.path.join(folder, "done"), "w").write("1\n")
        out, err = target.communicate(timeout=120)
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        ours = json.loads(lines[-1]) if lines else {"ok": False, "error": err[-2000:]}
        return {"ok": all(r["ok"] for r in rows) and ours.get("ok") and target.returncode == 0,
                "pyverbs_received": rows, "dicomm": ours, "target_exit": target.returncode,
                "pyverbs_read_bytes": recv.read_bytes, "wrong_version": version, "wrong_eager": eager,
                "dicomm_stderr": err[-2000:]}
    finally:
        if target.poll() is None:
            target.kill()
            target.wait()
        for c in conns:
            c.close()


def main() -> int:
    try:
        if sys.argv[1] == "probe":
            res = {"ok": True, **probe()}
        elif sys.argv[1] == "exchange":
            res = exchange(sys.argv[2], sys.argv[3])
        else:
            res = write(int(sys.argv[2]), sys.argv[3], sys.argv[4])
    except Exception as exc:  # reported as JSON: the test shows it
        import traceback
        res = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-2000:]}
    print(json.dumps(res), flush=True)
    return 0 if res.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
