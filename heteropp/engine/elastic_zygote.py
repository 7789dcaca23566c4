"""A host's warm process for elastic workers: imports torch and heteropp's elastic worker once, when the host
starts, then forks one child per request from heteropp.engine.elastic_spawn (the entry point the agent starts)
and runs the worker in it, with the requester's arguments, environment, working directory and standard streams.
Every round after the first so starts its workers without importing torch again.

    python -m heteropp.engine.elastic_zygote SOCKET

SOCKET is a path, or @NAME for a name in Linux's abstract socket namespace (what the host's keeper gives: it
leaves no file behind when the host is killed). The socket listens only once the imports are done (a worker
asking earlier starts the ordinary way), and a connection from another user is refused (the peer's uid, from
the kernel), since a request runs a worker with the requester's arguments. The zygote itself stays
single-threaded so that forking it is safe, and reports each child's exit status to its requester.
"""
from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys
import threading
import traceback

from heteropp.engine.elastic_spawn import address, peer_uid

WARM_ENV = "HETEROPP_WARM_START"


def _child(conn: socket.socket, request: dict, fds: list[int]) -> None:
    """In the forked child: become the worker the request describes, and die with its requester."""
    try:
        for target, fd in zip((0, 1, 2), fds):
            os.dup2(fd, target)
        for fd in fds:
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        os.environ[WARM_ENV] = "1"  # the worker says so in its round's events
        sys.argv = ["heteropp.engine.elastic", *request["argv"]]
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(s, signal.SIG_DFL)

        def watch() -> None:  # the requester closes the connection only by dying: so does the worker
            try:
                while conn.recv(1):
                    pass
            except OSError:
                pass
            os.kill(os.getpid(), signal.SIGKILL)

        threading.Thread(target=watch, daemon=True).start()
        from heteropp.engine import elastic
        code = elastic.main(request["argv"])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, int) and e.code is not None:
            print(e.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def serve(path: str) -> None:
    import torch  # noqa: F401  what every worker needs, imported once here
    import torch.distributed  # noqa: F401
    from heteropp.engine import elastic, worker  # noqa: F401
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    abstract = path.startswith("@")
    listener.bind(address(path) if abstract else path + ".tmp")
    listener.listen(64)
    if not abstract:
        os.replace(path + ".tmp", path)  # appears whole, after the imports
    children: dict[int, socket.socket] = {}
    while True:
        ready, _, _ = select.select([listener], [], [], 0.05)
        if ready:
            conn, _ = listener.accept()
            fds: list[int] = []
            try:
                uid = peer_uid(conn)
                if uid != os.getuid():
                    raise ValueError(f"a connection from uid {uid} refused: this zygote serves uid {os.getuid()} only")
                msg, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
                request = json.loads(msg)
                if len(fds) != 3 or not isinstance(request, dict) or not isinstance(request.get("argv"), list):
                    raise ValueError("expected a JSON request and three file descriptors")
            except (OSError, ValueError) as e:
                for fd in fds:
                    os.close(fd)
                try:
                    conn.sendall(json.dumps({"error": str(e)}).encode() + b"\n")
                finally:
                    conn.close()
                continue
            pid = os.fork()
            if pid == 0:
                listener.close()
                for c in children.values():
                    c.close()
                _child(conn, request, fds)
            for fd in fds:
                os.close(fd)
            children[pid] = conn
            try:
                conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
            except OSError:
                pass
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = children.pop(pid, None)
            if conn is not None:
                code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
                try:
                    conn.sendall(json.dumps({"status": code}).encode() + b"\n")
                except OSError:
                    pass
                conn.close()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m heteropp.engine.elastic_zygote SOCKET")
    serve(sys.argv[1])
