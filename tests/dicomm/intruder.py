"""A hostile client of a dicomm rank, stdlib only (it runs as another user, outside the venv).

It knows what anyone who can read the job's c10d store knows (the job token and the address cards)
and speaks the connection protocol: the v2 challenge-response (the listener speaks first) or the
v1 plain hello (the listener waits). It claims to be rank `src`, and once let in injects one eager
message: over tcp a frame, over shm a slot in a segment it made itself. It prints one JSON line:
{"accepted": the listener sent its handshake proof (v2) or did not hang up at once (v1),
 "closed": the listener hung up on it afterwards}.

`tcp-data` instead announces a 16-byte message (a ready-to-send) and, once cleared to send, sends
one data frame at offset 2^64 - value carrying value + 16 bytes of 0xAB: a sum offset + bytes that
wraps to 16. It adds "cleared": whether the clear-to-send came.

`tcp-fuzz` sends frames drawn from the seed given as <value> (attack_tcp_fuzz).

    python intruder.py <tcp|tcp-data|tcp-fuzz|shm> <address> <token hex> <secret or ''> <src> <dst> <tag> <value>

`listen-tcp` / `listen-shm` play the other side: it listens (on 127.0.0.1 or an abstract Unix
socket), prints {"address": ...} at once, answers each connection's handshake as a listener would
(the challenge, then the proof over the connector's hello) and reads what follows for a while. It
then prints {"handshake": it sent its proof, "got": whether <needle> arrived (on the socket or in a
shared segment passed to it), "hung_up": the connector closed a connection on it}; it stops at the
first of these or after <seconds>.

    python intruder.py <listen-tcp|listen-shm> <token hex> <secret or ''> <needle> <seconds> [tcp address to bind]
"""
from __future__ import annotations

import fcntl
import hashlib
import hmac
import json
import mmap
import os
import socket
import struct
import sys
import time

MAGIC = 0x4D434944
TRANSPORT_ID = {"tcp": 1, "shm": 2, "verbs": 3}
# Layout of transport/shm/segment.h (every struct aligned to 64 bytes): five 64-byte counter words,
# 64 slots of a 64-byte header + 16 KiB, 256 acks, 16 shares, 8 chunks of a 64-byte header + 512 KiB.
SLOTS_AT, SLOT_BYTES = 5 * 64, 64 + 16 * 1024
SEGMENT_BYTES = SLOTS_AT + 64 * SLOT_BYTES + 256 * 64 + 16 * 64 + 8 * (64 + 512 * 1024)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        part = sock.recv(n - len(data))
        if not part:
            raise ConnectionError("closed")
        data += part
    return data


def handshake(sock: socket.socket, key_token: bytes, secret: bytes, transport: str, src: int, dst: int,
              nstreams: int = 1, fds: tuple[int, ...] = (), challenge_wait_s: float = 0.5) -> bool:
    """Performs whichever handshake the listener speaks (a v2 listener's challenge comes within
    challenge_wait_s); True if it let us in."""
    tid = TRANSPORT_ID[transport]
    sock.settimeout(challenge_wait_s)
    try:
        challenge = _recv_exact(sock, 24)
    except (socket.timeout, ConnectionError):
        challenge = None
    if challenge is None:  # v1: the token in the clear, no answer
        hello = struct.pack("<IHH16siiHHI2Q", MAGIC, 1, tid, key_token, src, dst, 0, nstreams, 0, 0, 0)
        socket.send_fds(sock, [hello], list(fds)) if fds else sock.sendall(hello)
        return True
    key = key_token + secret
    nonce = os.urandom(16)
    head = struct.pack("<IHHiiHHI2Q16s", MAGIC, 2, tid, src, dst, 0, nstreams, 0, 0, 0, nonce)
    mac = hmac.new(key, b"dicomm hello" + challenge[8:24] + head + bytes(32), hashlib.sha256).digest()
    hello = head + mac
    if fds:
        socket.send_fds(sock, [hello], list(fds))
    else:
        sock.sendall(hello)
    try:
        proof = _recv_exact(sock, 32)
    except (socket.timeout, ConnectionError, OSError):
        return False
    return proof == hmac.new(key, b"dicomm accept" + hello, hashlib.sha256).digest()


# Returns as soon as the listener hangs up; the bound only has to outlast a loaded host's stalls
# (and stay inside the caller's 30 s for the whole intruder).
def _closed(sock: socket.socket, within_s: float = 15.0) -> bool:
    sock.settimeout(within_s)
    try:
        return sock.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


# transport/tcp/frame.h: kind, code, msg_id, tag, meta, bytes, offset, tag_seq, reserved (56 bytes).
FRAME = struct.Struct("<IIQQQQQII")
K_RTS, K_DATA, K_CTS = 2, 3, 4


def attack_tcp_data(address: str, token: bytes, secret: bytes, src: int, dst: int, tag: int, k: int) -> dict:
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=5)
    accepted = handshake(sock, token, secret, "tcp", src, dst)
    cleared = False
    try:
        sock.sendall(FRAME.pack(K_RTS, 0, 1, tag, 0, 16, 0, 0, 0))
        sock.settimeout(15)
        cts = FRAME.unpack(_recv_exact(sock, FRAME.size))
        cleared = cts[0] == K_CTS and cts[2] == 1
        if cleared:
            sock.sendall(FRAME.pack(K_DATA, 0, 1, 0, 0, k + 16, (1 << 64) - k, 0, 0) + b"\xab" * (k + 16))
    except (OSError, ConnectionError):
        pass
    out = {"accepted": accepted, "cleared": cleared, "closed": _closed(sock)}
    sock.close()
    return out


def attack_tcp_fuzz(address: str, token: bytes, secret: bytes, src: int, dst: int, tag: int, seed: int) -> dict:
    """A valid handshake, then frames drawn from `seed`: eager messages on other tags (some with
    lengths past what a frame may carry), one announcement for the receiver's posted receive and,
    once cleared, its data in chunks, valid or with one frame mutated (offsets and lengths that
    wrap, overlap or overrun, an unknown id, a stray kind). Reports what it sent, so the receiver
    can check that a receive that completed holds exactly the valid message."""
    import random

    rng = random.Random(seed)
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=5)
    out = {"accepted": handshake(sock, token, secret, "tcp", src, dst), "cleared": False, "mutated": None,
           "message": None}
    try:
        for _ in range(rng.randrange(4)):  # eager messages nobody asked for
            n = rng.choice([0, 1, 8, 1000, (256 << 10) - 56, 1 << 20])
            body = bytes(rng.randrange(256) for _ in range(min(n, 64)))
            sock.sendall(FRAME.pack(1, 0, 0, tag + 1 + rng.randrange(3), 0, n, 0, 0, 0) + body)
            if n > len(body):  # a claim longer than what follows: a violation, or data never completed
                out["mutated"] = f"eager frame of {n} B"
                raise ConnectionError("done")
        size = rng.choice([1, 16, 40, 64, 65])
        message = bytes(rng.randrange(256) for _ in range(size))
        out["message"] = message.hex()
        sock.sendall(FRAME.pack(K_RTS, 0, 7, tag, 0, size, 0, 0, 0))
        sock.settimeout(10)
        answer = FRAME.unpack(_recv_exact(sock, FRAME.size))
        out["cleared"] = answer[0] == K_CTS
        if not out["cleared"]:
            raise ConnectionError("refused")
        cuts = sorted({0, size, *(rng.randrange(size + 1) for _ in range(rng.randrange(3)))})
        frames = [[K_DATA, 7, cuts[i], cuts[i + 1] - cuts[i]] for i in range(len(cuts) - 1)]
        if rng.random() < 0.6:
            f = rng.choice(frames)
            how = rng.choice(["wrap", "overlap", "overrun", "id", "kind", "huge"])
            if how == "wrap":
                k = rng.choice([1, 16, 4096, 65536])
                f[2], f[3] = (1 << 64) - k, k + f[3]
            elif how == "overlap":
                frames.append([K_DATA, 7, 0, size])
            elif how == "overrun":
                f[3] += rng.choice([1, 64, 4096])
            elif how == "id":
                f[1] = 8
            elif how == "kind":
                f[0] = rng.choice([0, 4, 5, 9])
            else:
                f[3] = (1 << 64) - 1
            out["mutated"] = how
        for kind, mid, off, n in frames:
            lo = min(off, size)
            body = (message[lo:lo + n] + bytes(min(n, 8192)))[:min(n, 8192)]
            sock.sendall(FRAME.pack(kind, 0, mid, 0, 0, n % (1 << 64), off % (1 << 64), 0, 0) + body)
    except (OSError, ConnectionError):
        pass
    out["closed"] = _closed(sock, within_s=3.0 if out["mutated"] else 0.1)
    sock.close()
    return out


def attack_tcp(address: str, token: bytes, secret: bytes, src: int, dst: int, tag: int, value: int) -> dict:
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=5)
    accepted = handshake(sock, token, secret, "tcp", src, dst)
    payload = struct.pack("<q", value)
    frame = struct.pack("<IIQQQQQ", 1, 0, 0, tag, 0, len(payload), 0)  # kEager
    try:
        sock.sendall(frame + payload)
    except OSError:
        pass
    out = {"accepted": accepted, "closed": _closed(sock)}
    sock.close()
    return out


def attack_shm(address: str, token: bytes, secret: bytes, src: int, dst: int, tag: int, value: int) -> dict:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect("\0" + address)
    # Sealed against shrinking, as a rank's own segment is: an unsealed one is refused before any
    # check of who sent it, and the intruder would test nothing else.
    memfd = os.memfd_create("x", os.MFD_ALLOW_SEALING)
    os.ftruncate(memfd, SEGMENT_BYTES)
    fcntl.fcntl(memfd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
    seg = mmap.mmap(memfd, SEGMENT_BYTES)
    accepted = handshake(sock, token, secret, "shm", src, dst, fds=(memfd,))
    payload = struct.pack("<q", value)
    # Slot 0: kind, pad, tag, meta, bytes, msg_id, addr, pad2, then the payload; seq = 1 publishes it.
    struct.pack_into("<IIQQQQQQ", seg, SLOTS_AT + 8, 1, 0, tag, 0, len(payload), 0, 0, 0)
    seg[SLOTS_AT + 64:SLOTS_AT + 64 + len(payload)] = payload
    struct.pack_into("<Q", seg, SLOTS_AT, 1)
    try:
        sock.sendall(b"\1")  # the doorbell, in case the receiver sleeps
    except OSError:
        pass
    time.sleep(0.5)
    out = {"accepted": accepted, "closed": _closed(sock)}
    sock.close()
    return out


def _serve_one(conn: socket.socket, kind: str, key: bytes, needle: bytes, seconds: float, out: dict) -> None:
    """One connection: the listener's handshake, then whatever arrives (on the socket or in the
    segment passed with the hello) until the needle is seen or the time is up."""
    conn.settimeout(seconds)
    hello, fds = b"", []
    try:
        conn.sendall(struct.pack("<IHH16s", MAGIC, 2, 0, os.urandom(16)))
        while len(hello) < 88:
            if kind == "listen-shm":
                part, got_fds, _, _ = socket.recv_fds(conn, 88 - len(hello), 4)
                fds += got_fds
            else:
                part = conn.recv(88 - len(hello))
            if not part:
                out["hung_up"] = True
                return
            hello += part
        conn.sendall(hmac.new(key, b"dicomm accept" + hello, hashlib.sha256).digest())
        out["handshake"] = True
        deadline = time.monotonic() + seconds
        data = b""
        while time.monotonic() < deadline and not out["got"]:
            conn.settimeout(max(0.05, min(0.2, deadline - time.monotonic())))
            try:
                part = conn.recv(65536)
                if not part:
                    out["hung_up"] = True  # the connector turned us away: nothing more will come
                    break
                data += part
            except socket.timeout:
                pass
            for fd in fds:  # the shared segment the connector made: its eager slots
                with mmap.mmap(fd, os.fstat(fd).st_size, prot=mmap.PROT_READ) as seg:
                    if seg.find(needle) >= 0:
                        data += needle
            out["got"] |= needle in data
    except (OSError, ConnectionError):
        out["hung_up"] = True


def play_listener(kind: str, token: bytes, secret: bytes, needle: bytes, seconds: float,
                  host: str = "127.0.0.1") -> dict:
    import threading

    if kind == "listen-tcp":
        srv = socket.create_server((host, 0))
        address = f"{host}:{srv.getsockname()[1]}"
    else:
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        name = f"dicomm-impostor-{os.getpid()}"
        srv.bind("\0" + name)
        srv.listen(8)
        address = name
    print(json.dumps({"address": address}), flush=True)
    out = {"handshake": False, "got": False, "hung_up": False}
    threads = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not out["got"] and not out["hung_up"]:  # every stream
        srv.settimeout(max(0.05, min(0.5, deadline - time.monotonic())))
        try:
            conn, _ = srv.accept()
        except socket.timeout:
            continue
        t = threading.Thread(target=_serve_one, args=(conn, kind, token + secret, needle, seconds, out), daemon=True)
        t.start()
        threads.append(t)
    for t in threads:
        t.join(timeout=1)
    return dict(out)


def main(argv: list[str]) -> int:
    if argv[0].startswith("listen-"):
        kind, token_hex, secret, needle, seconds, *host = argv
        out = play_listener(kind, bytes.fromhex(token_hex), secret.encode(), needle.encode(), float(seconds), *host)
        print(json.dumps(out), flush=True)
        return 0
    transport, address, token_hex, secret, src, dst, tag, value = argv
    attack = {"tcp": attack_tcp, "tcp-data": attack_tcp_data, "tcp-fuzz": attack_tcp_fuzz, "shm": attack_shm}[transport]
    out = attack(address, bytes.fromhex(token_hex), secret.encode(), int(src), int(dst), int(tag), int(value))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
