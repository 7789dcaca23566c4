"""An exclusive lock on one resource of the machine that tests hold for as long as they use it: a network
namespace on a fixed subnet, a system user that a fixture creates and deletes. Two pytest-xdist workers of
`make test`, or two checkouts testing at once, so take turns instead of undoing each other's setup."""
from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def machine_lock(resource: str) -> Iterator[None]:
    """Held until the block ends (released by the kernel if the process dies)."""
    path = os.path.join(tempfile.gettempdir(), f"ditorch-tests-{resource}.lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
