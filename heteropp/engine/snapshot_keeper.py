"""A host's snapshot keeper: holds in memory the training state that elastic ranks send it every few steps (their
own host's, and a peer host's), so that a round after a failure resumes from memory instead of the disk
checkpoint. It outlives the host's workers, which torch's elastic agent restarts at every membership change: it
runs the host's agent (torchrun) as its child and tells it, and so every worker, where it listens
(HETEROPP_SNAPSHOT_KEEPER=ADDR:PORT). It also starts the host's warm process for new workers
(heteropp.engine.elastic_zygote; HETEROPP_ZYGOTE names its socket).

    python heteropp/engine/snapshot_keeper.py --listen ADDR[:PORT] [--keep 3] [--no-zygote] -- torchrun ...

It imports neither torch nor heteropp (it runs as a script: a host starts it in a fraction of a second) and
holds bytes only. The wire format, one frame per message, both ways:

    b"HPSK" | header length (u32, big-endian) | payload length (u64) | header (a JSON object, UTF-8) | payload

A connection starts with the keeper's hello frame (`nonce`, 16 random bytes in hex). A rank's first request
carries its own `nonce` and `proof` = HMAC-SHA256(job key, "rank" | keeper nonce | rank nonce), checked before
the request's payload is read (an unauthenticated peer cannot make a keeper read or hold its bytes); every reply
carries the keeper's `proof` = HMAC-SHA256(job key, "keeper" | keeper nonce | rank nonce), which the rank checks
before it believes a snapshot (a process that does not know the key cannot pose as a keeper and hand out
state). The job key is derived from `DICOMM_JOB_SECRET`; without a secret both proofs are empty and any local
process can talk to a keeper.

Requests (header `op`): `put` (a rank's state after a step: `round`, `round_t`, `step`, `rank`, `ranks`, `meta`
and `pieces`, each piece naming its place in the payload), `index` (every snapshot held, pieces without
bytes) and `get` (some pieces of one rank's snapshot, their bytes as the payload). Nothing in a frame is trusted
for a length or an offset: the header and payload lengths are bounded before anything is read or allocated, and
every piece's offset and size are checked against the payload and its shape.
"""
from __future__ import annotations

import argparse
import collections
import hashlib
import hmac
import json
import os
import secrets
import signal
import socket
import socketserver
import struct
import subprocess
import sys
import threading
from typing import Any

MAGIC = b"HPSK"
PREFIX = struct.Struct(">4sIQ")
MAX_HEADER = 1 << 24
KINDS = ("master", "exp_avg", "exp_avg_sq")
DTYPE_BYTES = {"float32": 4}
KEEPER_ENV = "HETEROPP_SNAPSHOT_KEEPER"
ZYGOTE_ENV = "HETEROPP_ZYGOTE"  # heteropp.engine.elastic_spawn's: the host's warm process for new workers
TOKEN_ENV = "DICOMM_JOB_SECRET"  # the job's secret: a keeper answers only ranks of its job


class ProtocolError(ValueError):
    """A frame that is not one this protocol writes."""


def job_key() -> bytes:
    """The key both sides prove they hold: derived from the job's secret (empty without one)."""
    secret = os.environ.get(TOKEN_ENV, "")
    return hashlib.sha256(b"heteropp-snapshot:" + secret.encode()).digest() if secret else b""


def proof(role: str, keeper_nonce: str, rank_nonce: str) -> str:
    """HMAC of the role and both nonces under the job key ("" without a secret)."""
    key = job_key()
    if not key:
        return ""
    return hmac.new(key, f"{role}|{keeper_nonce}|{rank_nonce}".encode(), hashlib.sha256).hexdigest()


def new_nonce() -> str:
    return os.urandom(16).hex()


def _recv_exact(sock: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError(f"the peer closed the connection after {got} of {n} bytes")
        got += k
    return buf


def parse_prefix(raw: bytes, max_payload: int) -> tuple[int, int]:
    """(header length, payload length) of a frame's first 16 bytes, both within bounds."""
    if len(raw) != PREFIX.size:
        raise ProtocolError(f"a frame starts with {PREFIX.size} bytes, got {len(raw)}")
    magic, hlen, plen = PREFIX.unpack(raw)
    if magic != MAGIC:
        raise ProtocolError(f"bad magic {magic!r}, expected {MAGIC!r}")
    if not 2 <= hlen <= MAX_HEADER:
        raise ProtocolError(f"header length {hlen} outside 2..{MAX_HEADER}")
    if plen > max_payload:
        raise ProtocolError(f"payload length {plen} exceeds the limit {max_payload}")
    return hlen, plen


def parse_header(raw: bytes | bytearray) -> dict[str, Any]:
    try:
        header = json.loads(bytes(raw).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ProtocolError(f"the header is not JSON: {e}") from None
    if not isinstance(header, dict):
        raise ProtocolError(f"the header is a {type(header).__name__}, expected an object")
    return header


def read_head(sock: socket.socket, max_payload: int) -> tuple[dict[str, Any], int]:
    """A frame's header and its payload's length (not read yet)."""
    hlen, plen = parse_prefix(bytes(_recv_exact(sock, PREFIX.size)), max_payload)
    return parse_header(_recv_exact(sock, hlen)), plen


def read_frame(sock: socket.socket, max_payload: int) -> tuple[dict[str, Any], bytearray]:
    header, plen = read_head(sock, max_payload)
    return header, _recv_exact(sock, plen)


def write_frame(sock: socket.socket, header: dict[str, Any], payload: bytes | bytearray | memoryview = b"") -> None:
    h = json.dumps(header).encode()
    sock.sendall(PREFIX.pack(MAGIC, len(h), len(payload)) + h)
    if len(payload):
        sock.sendall(payload)


def _int(v: Any, what: str, lo: int = 0) -> int:
    if type(v) is not int or v < lo:
        raise ProtocolError(f"{what} is {v!r}, expected an integer >= {lo}")
    return v


def check_pieces(pieces: Any, payload_len: int) -> list[dict[str, Any]]:
    """The pieces of a put, each inside the payload and as long as its shape says."""
    if not isinstance(pieces, list):
        raise ProtocolError(f"pieces is {type(pieces).__name__}, expected a list")
    out = []
    for i, p in enumerate(pieces):
        if not isinstance(p, dict):
            raise ProtocolError(f"piece {i} is {type(p).__name__}, expected an object")
        if not isinstance(p.get("key"), str) or p.get("kind") not in KINDS or p.get("dtype") not in DTYPE_BYTES:
            raise ProtocolError(f"piece {i}: key, kind (one of {KINDS}) or dtype (float32) missing or wrong")
        shape, full = p.get("shape"), p.get("full")
        if not isinstance(shape, list) or not isinstance(full, list) or len(shape) != len(full) or len(shape) > 8:
            raise ProtocolError(f"piece {i}: shape and full must be lists of one length (at most 8)")
        n = DTYPE_BYTES[p["dtype"]]
        for d, (s, f) in enumerate(zip(shape, full)):
            n *= _int(s, f"piece {i} shape[{d}]")
            _int(f, f"piece {i} full[{d}]")
        dim = p.get("dim")
        if dim is not None:
            _int(dim, f"piece {i} dim")
            if dim >= len(shape):
                raise ProtocolError(f"piece {i}: dim {dim} beyond its {len(shape)} dimensions")
        start = _int(p.get("start"), f"piece {i} start")
        for d, (s, f) in enumerate(zip(shape, full)):
            lo = start if d == dim else 0
            if lo + s > f:
                raise ProtocolError(f"piece {i}: [{lo}, {lo + s}) on dimension {d} exceeds the full size {f}")
        offset, nbytes = _int(p.get("offset"), f"piece {i} offset"), _int(p.get("nbytes"), f"piece {i} nbytes")
        if nbytes != n or offset + nbytes > payload_len:
            raise ProtocolError(f"piece {i}: {nbytes} bytes at {offset} (its shape needs {n}) outside a payload "
                                f"of {payload_len}")
        out.append(p)
    return out


class Store:
    """Snapshots by (round, step), the newest `keep` kept, each {rank: (header, payload)}."""

    def __init__(self, keep: int, max_bytes: int) -> None:
        self.keep, self.max_bytes = keep, max_bytes
        self.snaps: collections.OrderedDict[tuple[str, int], dict[int, tuple[dict[str, Any], bytes]]] = \
            collections.OrderedDict()
        self.lock = threading.Lock()

    def held(self) -> int:
        return sum(len(p) for s in self.snaps.values() for _, p in s.values())

    def put(self, h: dict[str, Any], payload: bytearray) -> None:
        if not isinstance(h.get("round"), str) or not isinstance(h.get("round_t"), (int, float)):
            raise ProtocolError("a put needs round (text) and round_t (a number)")
        step, ranks = _int(h.get("step"), "step"), _int(h.get("ranks"), "ranks", 1)
        rank = _int(h.get("rank"), "rank")
        if rank >= ranks:
            raise ProtocolError(f"rank {rank} of {ranks} ranks")
        if h.get("meta") is not None and not isinstance(h["meta"], dict):
            raise ProtocolError("meta must be an object or null")
        pieces = check_pieces(h.get("pieces"), len(payload))
        entry = ({"round": h["round"], "round_t": h["round_t"], "step": step, "rank": rank, "ranks": ranks,
                  "meta": h.get("meta"), "pieces": pieces}, bytes(payload))
        with self.lock:
            tag = (h["round"], step)
            if tag not in self.snaps:
                self.snaps[tag] = {}
                while len(self.snaps) > self.keep:
                    self.snaps.popitem(last=False)
            if self.held() + len(payload) > self.max_bytes:
                raise ProtocolError(f"holding {len(payload)} more bytes would exceed this keeper's "
                                    f"{self.max_bytes} (--max-bytes)")
            self.snaps[tag][rank] = entry

    def index(self) -> list[dict[str, Any]]:
        with self.lock:
            return [{**h, "pieces": [{k: v for k, v in p.items() if k not in ("offset", "nbytes")}
                                     for p in h["pieces"]]}
                    for s in self.snaps.values() for h, _ in s.values()]

    def get(self, h: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
        tag, rank = (h.get("round"), h.get("step")), h.get("rank")
        want = h.get("pieces")
        with self.lock:
            entry = self.snaps.get(tag, {}).get(rank) if isinstance(tag[0], str) else None  # type: ignore[arg-type]
        if entry is None:
            raise ProtocolError(f"no snapshot of round {tag[0]!r} step {tag[1]!r} rank {rank!r} here")
        head, data = entry
        if not isinstance(want, list) or any(type(i) is not int or not 0 <= i < len(head["pieces"]) for i in want):
            raise ProtocolError(f"pieces must be indices below {len(head['pieces'])}")
        out, parts, off = [], [], 0
        for i in want:
            p = head["pieces"][i]
            parts.append(data[p["offset"]:p["offset"] + p["nbytes"]])
            out.append({**p, "offset": off})
            off += p["nbytes"]
        return {"ok": True, "pieces": out}, b"".join(parts)


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        store: Store = self.server.store  # type: ignore[attr-defined]
        sock: socket.socket = self.request
        mine = new_nonce()
        self.answer, authed = "", False  # the keeper's proof, once the rank has proved itself
        self._reply(sock, {"ok": True, "nonce": mine})
        while True:
            try:
                h, plen = read_head(sock, store.max_bytes)
                if not authed:  # the first request: proved before its payload is read
                    theirs = h.get("nonce")
                    if not isinstance(theirs, str) or not hmac.compare_digest(str(h.get("proof", "")),
                                                                             proof("rank", mine, theirs)):
                        raise ProtocolError("wrong proof: not a rank of this keeper's job (DICOMM_JOB_SECRET)")
                    self.answer, authed = proof("keeper", mine, theirs), True
                payload = _recv_exact(sock, plen)
            except (ConnectionError, OSError):
                return
            except ProtocolError as e:
                self._reply(sock, {"ok": False, "error": str(e)})
                return  # the stream cannot be trusted past a bad frame
            try:
                op = h.get("op")
                if op == "put":
                    store.put(h, payload)
                    self._reply(sock, {"ok": True})
                elif op == "index":
                    self._reply(sock, {"ok": True, "snapshots": store.index()})
                elif op == "get":
                    self._reply(sock, *store.get(h))
                else:
                    raise ProtocolError(f"unknown op {op!r}, expected put, index or get")
            except ProtocolError as e:
                self._reply(sock, {"ok": False, "error": str(e)})

    def _reply(self, sock: socket.socket, header: dict[str, Any], payload: bytes = b"") -> None:
        try:
            write_frame(sock, {**header, "proof": self.answer} if self.answer else header, payload)
        except OSError:
            pass


class Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, addr: tuple[str, int], store: Store) -> None:
        super().__init__(addr, _Handler)
        self.store = store


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="A host's in-memory snapshot keeper; runs the host's agent as its child.")
    ap.add_argument("--listen", required=True, help="ADDR[:PORT] the ranks of other hosts reach this one at "
                                                    "(port 0 or none: any free one)")
    ap.add_argument("--keep", type=int, default=3, help="snapshots (round, step) held (default 3)")
    ap.add_argument("--max-bytes", type=int, default=16 << 30, help="bytes held at most (default 16 GiB)")
    ap.add_argument("--no-zygote", action="store_true",
                    help="start no warm process for the host's workers (heteropp.engine.elastic_zygote): each new "
                    "worker imports torch itself")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- the agent's command (torchrun ...)")
    a = ap.parse_args(argv)
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd or a.keep < 1:
        ap.error("give the agent's command after -- and --keep >= 1")
    host, _, port = a.listen.rpartition(":") if ":" in a.listen else (a.listen, "", "0")
    if not port.isdigit():
        ap.error(f"--listen {a.listen!r}: expected ADDR[:PORT]")
    server = Server((host, int(port)), Store(a.keep, a.max_bytes))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    where = f"{host}:{server.server_address[1]}"
    env = {**os.environ, KEEPER_ENV: where}
    zygote = None
    if not a.no_zygote:  # the host's warm process, beside the agent: new workers fork from it
        # an abstract socket name: nothing left on disk when the host is killed; the zygote serves this uid only
        env[ZYGOTE_ENV] = "@heteropp-zygote-" + secrets.token_hex(8)
        zygote = subprocess.Popen([sys.executable, "-u", "-m", "heteropp.engine.elastic_zygote", env[ZYGOTE_ENV]])
    child = subprocess.Popen(cmd, env=env)

    def forward(signum: int, _frame: object) -> None:
        child.send_signal(signum)

    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, forward)
    code = child.wait()
    server.shutdown()
    if zygote is not None:
        zygote.kill()
        zygote.wait()
    if code < 0:  # the agent died of a signal: so does its host
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


if __name__ == "__main__":
    sys.exit(main())
