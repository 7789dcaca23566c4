"""The entry point torch's elastic agent starts for each elastic worker: a stand-in that has a host's warm
process (heteropp.engine.elastic_zygote, torch and heteropp already imported) fork the real worker, so a new
round's workers start in a fraction of a second instead of importing torch again (seconds of CPU each, many more
of wall time on a loaded host). Without a zygote (HETEROPP_ZYGOTE unset, or not listening yet) it becomes
`python -m heteropp.engine.elastic` with the same arguments.

The agent sees this process as the worker: its exit status is the worker's (a worker killed by a signal kills
this process with the same signal), and the signals the agent sends it (SIGTERM to stop a round) reach the
worker. If this process dies, its connection closes and the worker kills itself. A script, run by path: it
imports neither torch nor heteropp.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys
import time

ZYGOTE_ENV = "HETEROPP_ZYGOTE"  # the zygote's unix socket, a path or @NAME (set by the host's snapshot keeper)
SPAWNED_ENV = "HETEROPP_SPAWNED_AT"  # when the agent started this process: the worker's birth for its phases


def address(socket_name: str) -> str:
    """The address to bind or connect to: @NAME is NAME in Linux's abstract namespace, anything else a path."""
    return "\0" + socket_name[1:] if socket_name.startswith("@") else socket_name


def peer_uid(conn: socket.socket) -> int:
    """The uid of the process at the other end of a unix socket, as the kernel recorded it at connect."""
    _pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                          struct.calcsize("3i")))
    return int(uid)


def read_line(conn: socket.socket) -> dict | None:
    """One JSON line from the zygote, or None at EOF; a line longer than 4 KiB is not the zygote's."""
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = conn.recv(1)
        if not chunk:
            return None
        buf += chunk
        if len(buf) > 4096:
            raise ValueError("the zygote's reply exceeds 4 KiB")
    return json.loads(buf)


def main() -> int:
    os.environ[SPAWNED_ENV] = repr(time.time())
    path = os.environ.get(ZYGOTE_ENV)
    conn = None
    if path:
        try:
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.connect(address(path))
        except OSError:  # no zygote (yet): an ordinary start
            conn = None
    if conn is not None:  # the worker's environment goes only to a zygote of this user (a name anyone could take)
        uid = peer_uid(conn)
        if uid != os.getuid():
            print(f"heteropp elastic_spawn: {path} is held by uid {uid}, not this user's zygote: starting the "
                  "worker the ordinary way", file=sys.stderr)
            conn.close()
            conn = None
    if conn is None:
        os.execv(sys.executable, [sys.executable, "-u", "-m", "heteropp.engine.elastic", *sys.argv[1:]])
    request = json.dumps({"argv": sys.argv[1:], "env": dict(os.environ), "cwd": os.getcwd()}).encode()
    socket.send_fds(conn, [request + b"\n"], [0, 1, 2])
    first = read_line(conn)
    if first is None or "pid" not in first:
        print(f"heteropp elastic_spawn: the zygote at {path} did not start the worker: {first}", file=sys.stderr)
        return 1
    pid = int(first["pid"])

    def forward(signum: int, _frame: object) -> None:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    forwarded = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    for s in forwarded:
        signal.signal(s, forward)
    done = read_line(conn)
    if done is None:  # the zygote died (its host is going down): the worker goes with it
        return 1
    status = int(done["status"])
    if status < 0:  # the worker died of a signal: so does its stand-in
        if -status in forwarded:  # this process's own handler back to the default (SIGKILL has none to set)
            signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
        return 128 - status  # a signal whose default is not to end a process: the shell's code for it
    return status


if __name__ == "__main__":
    sys.exit(main())
