"""The snippet server runs code as `python -c` does in a fresh interpreter: the same exit status, stdout
and stderr as a real `python -c` run (the reference) for a normal end, an uncaught exception, a
SystemExit, a signal, atexit handlers and the interpreter's finalization, the environment and sys.path."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest
from diopi_testlib import REPO_ROOT, SnippetServer

SNIPPETS = {
    "normal end": "import sys, torch; print(__name__, sys.argv, sys.path[0] == '', torch.is_tensor(torch.ones(1)))",
    "uncaught exception": "print('before'); raise ValueError('boom')",
    "SystemExit": "import sys; sys.exit(3)",
    "signal": "import os, signal; os.kill(os.getpid(), signal.SIGTERM)",
    "atexit and finalization": """
        import atexit, sys
        atexit.register(lambda: print('atexit ran'))
        class Finalized:
            def __del__(self): sys.stdout.write('finalized\\n')
        keep = Finalized()
        print('body')
    """,
    "environment": "import os; print(os.environ.get('SNIPPET_PROBE'), 'DIOPI_LIBRARY' in os.environ)",
    "working directory on the path":
        "import bench, os; print(os.getcwd() == os.path.dirname(os.path.dirname(bench.__file__)))",
    "stdin is empty": "import sys; print(repr(sys.stdin.read()))",
    "a second registration": "import torch; torch.utils.rename_privateuse1_backend('probe'); print('renamed')",
}


@pytest.fixture(scope="module")
def server():
    return SnippetServer()


@pytest.mark.parametrize("name", sorted(SNIPPETS))
def test_a_snippet_runs_as_python_c_runs_it(server, name):
    code = textwrap.dedent(SNIPPETS[name])
    env = {k: v for k, v in os.environ.items() if k != "DIOPI_LIBRARY"}
    env["SNIPPET_PROBE"] = name
    reference = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                               stdin=subprocess.DEVNULL, timeout=120)
    got = server.run(code, env, timeout=120)
    assert got.returncode == reference.returncode
    assert got.stdout == reference.stdout
    # tracebacks name the server's frames too; their last line, the error, is the same
    assert got.stderr.strip().splitlines()[-1:] == reference.stderr.strip().splitlines()[-1:]


def test_a_snippet_past_its_timeout_is_killed_and_the_server_runs_the_next(server):
    with pytest.raises(subprocess.TimeoutExpired):
        server.run("import time; print('started', flush=True); time.sleep(600)", dict(os.environ), timeout=5)
    assert server.run("print('next')", dict(os.environ), timeout=60).stdout == "next\n"


class _LateReader(SnippetServer):
    """Reads the server's first answer only after the snippet has long ended: both answers are then in
    the pipe together."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay

    def _reply(self, server, deadline):
        time.sleep(self.delay)
        self.delay = 0.0
        return super()._reply(server, deadline)


def test_two_answers_read_together_are_both_taken():
    got = _LateReader(delay=8.0).run("pass", dict(os.environ), timeout=30)  # a snippet done in about a second
    assert got.returncode == 0 and got.stdout == ""
