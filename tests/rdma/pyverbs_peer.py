"""A rank of dicomm's verbs wire protocol written with rdma-core's pyverbs, from docs/rdma.md
("Wire protocol") alone: the handshake on the TCP side channel, WireInfo, EagerHeader and Ctrl
messages, credits written into the peer's credit word, and rendezvous by RDMA READ. It imports
nothing of dicomm, so a transport that drifts from its documented contract fails against it.

Deliberately simple where the contract leaves room: one completion queue per connection, every
work request signaled, one SEND in flight at a time; RDMA reads in chunks of READ_CHUNK with up to
the peer's limit in flight.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import socket
import struct
import time
from dataclasses import dataclass

from pyverbs import enums as e
from pyverbs.addr import GID, AHAttr, GlobalRoute
from pyverbs.cq import CQ
from pyverbs.device import Context
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.wr import SGE, RecvWR, SendWR

PORT = 1
HELLO_MAGIC, HELLO_VERSION, TRANSPORT_VERBS = 0x4D434944, 2, 3
WIRE_MAGIC, WIRE_VERSION = 0x56434944, 2
CHALLENGE = struct.Struct("<IHH16s")           # 24 B
HELLO = struct.Struct("<IHHiiHHI16s16s32s")    # 88 B: ..., extra (16 B), nonce, mac
WIRE_INFO = struct.Struct("<IIII16sIIQIIII")   # 64 B
CTRL = struct.Struct("<IIQQQQQIIQ")            # 64 B
EAGER = struct.Struct("<IIQQ")                 # 24 B
K_EAGER, K_RTS, K_FIN, K_REFUSE, K_READY = 1, 2, 3, 4, 5
EAGER_BYTES = 8192          # this side's eager payload limit, sent in WireInfo; the peer must have the same
SLOTS = 32
READ_CHUNK = 256 * 1024     # this peer's own choice: differs from dicomm's default on purpose
OUR_RD_ATOM = 4             # RDMA reads this side serves at once
SQ_DEPTH = 64
WR_RECV, WR_SEND, WR_READ, WR_CREDIT = 1, 2, 3, 4   # wr_id = kind << 32 | index
ACCESS = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ


class ProtocolError(RuntimeError):
    pass


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ProtocolError(f"the side channel closed after {len(out)} of {n} bytes")
        out += chunk
    return out


def _mac(key: bytes, label: bytes, *parts: bytes) -> bytes:
    return hmac.new(key, label + b"".join(parts), hashlib.sha256).digest()


def _hello(key: bytes, challenge_nonce: bytes, src: int, dst: int) -> bytes:
    unsigned = HELLO.pack(HELLO_MAGIC, HELLO_VERSION, TRANSPORT_VERBS, src, dst, 0, 1, 0, bytes(16), os.urandom(16),
                          bytes(32))
    return unsigned[:56] + _mac(key, b"dicomm hello", challenge_nonce, unsigned)


def connector_handshake(sock: socket.socket, key: bytes, src: int, dst: int) -> None:
    magic, version, _, nonce = CHALLENGE.unpack(_recv_exact(sock, CHALLENGE.size))
    if (magic, version) != (HELLO_MAGIC, HELLO_VERSION):
        raise ProtocolError(f"bad challenge: magic {magic:#x} version {version}")
    hello = _hello(key, nonce, src, dst)
    sock.sendall(hello)
    if not hmac.compare_digest(_recv_exact(sock, 32), _mac(key, b"dicomm accept", hello)):
        raise ProtocolError("the listener's proof does not match the job key")


def listener_handshake(sock: socket.socket, key: bytes, self_rank: int, size: int) -> int:
    """Returns the connector's rank."""
    nonce = os.urandom(16)
    sock.sendall(CHALLENGE.pack(HELLO_MAGIC, HELLO_VERSION, 0, nonce))
    hello = _recv_exact(sock, HELLO.size)
    magic, version, transport, src, dst, stream, nstreams, _, _, _, mac = HELLO.unpack(hello)
    if (magic, version, transport) != (HELLO_MAGIC, HELLO_VERSION, TRANSPORT_VERBS):
        raise ProtocolError(f"bad hello: magic {magic:#x} version {version} transport {transport}")
    if not hmac.compare_digest(mac, _mac(key, b"dicomm hello", nonce, hello[:56] + bytes(32))):
        raise ProtocolError("the hello is not signed with the job key")
    if dst != self_rank or not 0 <= src < size or src == self_rank or stream >= nstreams:
        raise ProtocolError(f"hello from rank {src} to {dst} (stream {stream} of {nstreams})")
    sock.sendall(_mac(key, b"dicomm accept", hello))
    return src


@dataclass
class WireInfo:
    qpn: int
    psn: int
    mtu: int
    gid: bytes
    gid_index: int
    slots: int
    credit_addr: int
    credit_rkey: int
    rd_atom: int
    magic: int = WIRE_MAGIC
    version: int = WIRE_VERSION
    eager_bytes: int = EAGER_BYTES

    def pack(self) -> bytes:
        return WIRE_INFO.pack(self.magic, self.qpn, self.psn, self.mtu, self.gid, self.gid_index, self.slots,
                              self.credit_addr, self.credit_rkey, self.rd_atom, self.version, self.eager_bytes)

    @classmethod
    def unpack(cls, raw: bytes) -> WireInfo:
        magic, qpn, psn, mtu, gid, gid_index, slots, caddr, ckey, rd, version, eager = WIRE_INFO.unpack(raw)
        return cls(qpn, psn, mtu, gid, gid_index, slots, caddr, ckey, rd, magic, version, eager)


@dataclass
class Message:
    tag: int
    meta: int
    tag_seq: int
    data: bytes


@dataclass
class _Pull:  # a rendezvous message this side reads
    msg_id: int
    tag: int
    meta: int
    tag_seq: int
    bytes: int
    addr: int
    rkey: int
    ready: int
    mr: MR
    issued: int = 0
    done: int = 0


def _gid_bytes(ctx: Context, index: int) -> bytes:
    return bytes.fromhex(str(ctx.query_gid(PORT, index)).replace(":", ""))


def roce_v2_ipv4_gid(ctx: Context) -> int:
    pa = ctx.query_port(PORT)
    for entry in sorted(g.gid_index for g in ctx.query_gid_table(pa.gid_tbl_len) if g.port_num == PORT):
        try:
            raw = _gid_bytes(ctx, entry)
            v2 = ctx.query_gid_type(PORT, entry) == e.IBV_GID_TYPE_SYSFS_ROCE_V2
        except Exception:
            continue
        if v2 and raw[:12] == bytes(10) + b"\xff\xff":
            return entry
    raise ProtocolError("no RoCE v2 IPv4-mapped GID on port 1")


class Connection:
    """One RC queue pair to a dicomm rank: its receive slots, credits, SENDs and RDMA reads."""

    def __init__(self, ctx: Context, pd: PD, gid_index: int, side: socket.socket, what: str):
        self.ctx, self.pd, self.gid_index, self.side, self.what = ctx, pd, gid_index, side, what
        self.slot = 64 + EAGER_BYTES
        self.cq = CQ(ctx, SQ_DEPTH + SLOTS + 8)
        cap = QPCap(max_send_wr=SQ_DEPTH, max_recv_wr=SLOTS, max_send_sge=1, max_recv_sge=1)
        self.qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq, cap=cap))
        # [receive slots][one send slot][credit word][the source of our credit writes]
        self.credit_off = (SLOTS + 1) * self.slot
        self.mem = MR(pd, self.credit_off + 16, ACCESS)
        attr = QPAttr(qp_state=e.IBV_QPS_INIT, cur_qp_state=e.IBV_QPS_RESET)
        attr.qp_access_flags, attr.pkey_index, attr.port_num = ACCESS, 0, PORT
        self.qp.to_init(attr)
        self.posted = 0
        for s in range(SLOTS):
            self._post_recv(s)
        self.advertised = self.posted
        self.psn = int.from_bytes(os.urandom(3), "little")
        self.sent = 0               # SENDs posted: allowed while below the credit word
        self.sq_busy = 0            # send-queue entries in flight
        self.send_slot_busy = False
        self.max_reads, self.reads = 1, 0
        self.remote: WireInfo | None = None
        self.inbox: list[bytes] = []  # received SENDs, copied out of their slots, in arrival order
        self.pulls: dict[int, _Pull] = {}
        self.read_wr: dict[int, tuple[int, int]] = {}  # read index -> (msg_id, length)
        self.next_read = 0
        self.read_bytes = 0         # bytes this side read from the peer's buffers

    def local_info(self) -> WireInfo:
        return WireInfo(self.qp.qp_num, self.psn, int(self.ctx.query_port(PORT).active_mtu),
                        _gid_bytes(self.ctx, self.gid_index), self.gid_index, SLOTS, self.mem.buf + self.credit_off,
                        self.mem.rkey, OUR_RD_ATOM)

    def connect(self, r: WireInfo) -> None:
        if (r.magic, r.version, r.eager_bytes) != (WIRE_MAGIC, WIRE_VERSION, EAGER_BYTES):
            raise ProtocolError(f"{self.what}: peer wire magic {r.magic:#x} version {r.version} eager bytes "
                                f"{r.eager_bytes}")
        self.remote = r
        self.mem.write(struct.pack("<Q", r.slots), 8, self.credit_off)
        self.max_reads = max(1, min(OUR_RD_ATOM, r.rd_atom))
        attr = QPAttr()
        attr.path_mtu = min(r.mtu, int(self.ctx.query_port(PORT).active_mtu))
        attr.dest_qp_num, attr.rq_psn = r.qpn, r.psn
        attr.max_dest_rd_atomic, attr.min_rnr_timer = OUR_RD_ATOM, 12
        gr = GlobalRoute(dgid=GID(":".join(r.gid.hex()[i:i + 4] for i in range(0, 32, 4))), sgid_index=self.gid_index,
                         hop_limit=64)
        attr.ah_attr = AHAttr(gr=gr, is_global=1, port_num=PORT)
        self.qp.to_rtr(attr)
        attr.timeout, attr.retry_cnt, attr.rnr_retry, attr.sq_psn = 14, 7, 7, self.psn
        attr.max_rd_atomic = self.max_reads
        self.qp.to_rts(attr)

    # -- work requests

    def _post_recv(self, s: int) -> None:
        self.qp.post_recv(RecvWR(wr_id=WR_RECV << 32 | s, num_sge=1, sg=[SGE(self.mem.buf + s * self.slot, self.slot,
                                                                              self.mem.lkey)]))
        self.posted += 1

    def _post_send(self, kind: int, index: int, opcode: int, sge: SGE, raddr: int = 0, rkey: int = 0) -> None:
        wr = SendWR(wr_id=kind << 32 | index, opcode=opcode, num_sge=1, sg=[sge], send_flags=e.IBV_SEND_SIGNALED)
        if opcode in (e.IBV_WR_RDMA_WRITE, e.IBV_WR_RDMA_READ):
            wr.set_wr_rdma(rkey, raddr)
        self.qp.post_send(wr)
        self.sq_busy += 1

    def _credit(self) -> int:
        return struct.unpack("<Q", self.mem.read(8, self.credit_off))[0]

    def send(self, payload: bytes, deadline: float) -> None:
        """One SEND of at most a slot: waits for a credit and for the send slot to be free."""
        assert len(payload) <= self.slot, len(payload)
        while self.send_slot_busy or self.sent >= self._credit() or self.sq_busy >= SQ_DEPTH:
            self.poll(deadline)
        off = SLOTS * self.slot
        if payload:
            self.mem.write(payload, len(payload), off)
        self.send_slot_busy = True
        self._post_send(WR_SEND, 0, e.IBV_WR_SEND, SGE(self.mem.buf + off, len(payload), self.mem.lkey))
        self.sent += 1

    def _advertise(self) -> None:
        assert self.remote is not None
        if self.posted - self.advertised < SLOTS // 2 or self.sq_busy >= SQ_DEPTH:
            return
        self.mem.write(struct.pack("<Q", self.posted), 8, self.credit_off + 8)
        self._post_send(WR_CREDIT, 0, e.IBV_WR_RDMA_WRITE, SGE(self.mem.buf + self.credit_off + 8, 8, self.mem.lkey),
                        self.remote.credit_addr, self.remote.credit_rkey)
        self.advertised = self.posted

    def poll(self, deadline: float) -> None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{self.what}: nothing completed in time")
        n, wcs = self.cq.poll(num_entries=16)
        for wc in wcs[:n]:
            kind, index = wc.wr_id >> 32, wc.wr_id & 0xFFFFFFFF
            if wc.status != e.IBV_WC_SUCCESS:
                raise ProtocolError(f"{self.what}: work request kind {kind} completed with status {wc.status}")
            if kind == WR_RECV:
                self.inbox.append(self.mem.read(wc.byte_len, index * self.slot) if wc.byte_len else b"")
                self._post_recv(index)  # handled (copied out): the slot is posted again before it is advertised
                continue
            self.sq_busy -= 1
            if kind == WR_SEND:
                self.send_slot_busy = False
            elif kind == WR_READ:
                self.reads -= 1
                msg_id, length = self.read_wr.pop(index)
                self.pulls[msg_id].done += length
                self.read_bytes += length
        self._advertise()
        self._issue_reads()

    # -- the message protocol

    def _issue_reads(self) -> None:
        for p in self.pulls.values():
            while p.issued < min(p.ready, p.bytes) and self.reads < self.max_reads and self.sq_busy < SQ_DEPTH:
                n = min(READ_CHUNK, min(p.ready, p.bytes) - p.issued)
                self.read_wr[self.next_read] = (p.msg_id, n)
                self._post_send(WR_READ, self.next_read, e.IBV_WR_RDMA_READ, SGE(p.mr.buf + p.issued, n, p.mr.lkey),
                                p.addr + p.issued, p.rkey)
                self.next_read += 1
                self.reads += 1
                p.issued += n

    def _fold_ready(self) -> None:
        """kReady for a message being read: it may be read further."""
        for raw in list(self.inbox):
            if len(raw) == CTRL.size and struct.unpack_from("<I", raw)[0] == K_READY:
                _, _, msg_id, *_, ready = CTRL.unpack(raw)
                if msg_id in self.pulls:
                    self.pulls[msg_id].ready = max(self.pulls[msg_id].ready, ready)
                    self.inbox.remove(raw)
        self._issue_reads()

    def _next_ctrl(self, deadline: float) -> bytes:
        while not self.inbox:
            self.poll(deadline)
        return self.inbox.pop(0)

    def receive(self, deadline: float) -> Message:
        """The next message from the peer, eager or rendezvous (read, then acknowledged with kFin)."""
        while True:
            raw = self._next_ctrl(deadline)
            kind = struct.unpack_from("<I", raw)[0] if len(raw) >= 4 else -1
            if kind == K_EAGER and len(raw) >= EAGER.size:
                _, tag_seq, tag, meta = EAGER.unpack_from(raw)
                return Message(tag, meta, tag_seq, raw[EAGER.size:])
            if len(raw) != CTRL.size:
                raise ProtocolError(f"{self.what}: a {len(raw)} B message of kind {kind}")
            kind, _, msg_id, tag, meta, size, addr, rkey, tag_seq, ready = CTRL.unpack(raw)
            if kind == K_READY and msg_id in self.pulls:
                self.pulls[msg_id].ready = max(self.pulls[msg_id].ready, ready)
                continue
            if kind != K_RTS:
                raise ProtocolError(f"{self.what}: unexpected control message kind {kind}")
            p = _Pull(msg_id, tag, meta, tag_seq, size, addr, rkey, ready, MR(self.pd, max(size, 1), ACCESS))
            self.pulls[msg_id] = p
            self._issue_reads()
            while p.done < p.bytes:
                self.poll(deadline)
                self._fold_ready()
            del self.pulls[msg_id]
            data = p.mr.read(p.bytes, 0) if p.bytes else b""
            p.mr.close()
            self.send(CTRL.pack(K_FIN, 0, msg_id, 0, 0, 0, 0, 0, 0, 0), deadline)
            return Message(tag, meta, tag_seq, data)

    def send_message(self, data: bytes, tag: int, meta: int, msg_id: int, deadline: float) -> str:
        """Sends eagerly up to EAGER_BYTES, else announces a registered buffer and waits for kFin."""
        if len(data) <= EAGER_BYTES:
            self.send(EAGER.pack(K_EAGER, 0, tag, meta) + data, deadline)
            return "eager"
        mr = MR(self.pd, len(data), ACCESS)
        mr.write(data, len(data), 0)
        self.send(CTRL.pack(K_RTS, 0, msg_id, tag, meta, len(data), mr.buf, mr.rkey, 0, len(data)), deadline)
        raw = self._next_ctrl(deadline)
        kind, code, got_id = struct.unpack_from("<IIQ", raw)
        mr.close()
        if kind != K_FIN or got_id != msg_id:
            raise ProtocolError(f"{self.what}: message {msg_id} answered with kind {kind} (code {code}) for {got_id}")
        return "rendezvous"

    def close(self) -> None:
        for res in (self.qp, self.mem, self.cq):
            res.close()
        self.side.close()


def connect_to(ctx: Context, pd: PD, address: str, key: bytes, self_rank: int, peer: int,
               deadline: float) -> Connection:
    """Our send connection: the side channel to the peer's published "ip:port/device:port"."""
    host, port = address.split("/")[0].rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=max(1.0, deadline - time.monotonic()))
    connector_handshake(sock, key, self_rank, peer)
    conn = Connection(ctx, pd, roce_v2_ipv4_gid(ctx), sock, f"connection to rank {peer}")
    sock.sendall(conn.local_info().pack())
    conn.connect(WireInfo.unpack(_recv_exact(sock, WIRE_INFO.size)))
    return conn


def accept_from(ctx: Context, pd: PD, listener: socket.socket, key: bytes, self_rank: int, size: int) -> Connection:
    """The peer's send connection to us."""
    sock, _ = listener.accept()
    src = listener_handshake(sock, key, self_rank, size)
    theirs = WireInfo.unpack(_recv_exact(sock, WIRE_INFO.size))
    conn = Connection(ctx, pd, roce_v2_ipv4_gid(ctx), sock, f"connection from rank {src}")
    conn.connect(theirs)
    sock.sendall(conn.local_info().pack())
    return conn


def try_wire_info(address: str, key: bytes, self_rank: int, peer: int, version: int, eager_bytes: int,
                  deadline: float) -> dict:
    """Offers connection data of another wire version or eager size after a valid handshake; returns
    what the listener answered (its magic, version and eager size) and whether it then closed the
    side channel."""
    host, port = address.split("/")[0].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=max(1.0, deadline - time.monotonic())) as sock:
        connector_handshake(sock, key, self_rank, peer)
        sock.sendall(WireInfo(0, 0, 0, bytes(16), 0, 0, 0, 0, 0, version=version, eager_bytes=eager_bytes).pack())
        reply = WireInfo.unpack(_recv_exact(sock, WIRE_INFO.size))
        closed = sock.recv(1) == b""
    return {"reply_magic": reply.magic, "reply_version": reply.version, "reply_eager_bytes": reply.eager_bytes,
            "closed": closed}
