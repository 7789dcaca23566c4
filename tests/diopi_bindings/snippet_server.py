"""A fork server for the DIOPI tests' snippets: it imports torch once, then runs each snippet in a child
forked from it, as `python -c` would run it in a fresh interpreter (its own process, `__main__`,
environment, stdout and stderr files, the working directory on sys.path, full finalization at exit, the
exit status of an uncaught exception or a signal). What it saves is torch's import, ~3 s of CPU per
snippet. The server itself runs no operator, so each child starts with torch imported and nothing else.

Protocol, one JSON line each way: the client sends {"code", "env", "stdout", "stderr"} on the server's
stdin; the server answers {"pid"} once the child runs, then {"returncode"} (negative: the signal)."""
from __future__ import annotations

import json
import os
import sys
import types

import torch  # noqa: F401  (the import every snippet would otherwise pay)


def run_child(request: dict, replies_fd: int) -> None:
    """In the forked child: become a fresh `python -c` run of the request's code; never returns."""
    os.environ.clear()
    os.environ.update(request["env"])
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, replies_fd)  # the server's answers are not the child's to write (kept open: closed at exit)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), fd)
    sys.argv = ["-c"]
    sys.path[0] = ""  # python -c puts the working directory first
    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main
    # An uncaught exception propagates out of the server's loop: the interpreter prints it and exits 1,
    # a SystemExit sets the status, as under python -c.
    exec(compile(request["code"], "<string>", "exec"), main.__dict__)
    raise SystemExit(0)


def serve() -> None:
    replies_fd = os.dup(1)
    replies = os.fdopen(replies_fd, "w", buffering=1)
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            run_child(request, replies_fd)
        replies.write(json.dumps({"pid": pid}) + "\n")
        _, status = os.waitpid(pid, 0)
        replies.write(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}) + "\n")


if __name__ == "__main__":
    serve()
