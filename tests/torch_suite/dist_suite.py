"""PyTorch's own distributed test suite, on the backend named by the BACKEND variable.

`torch.testing._internal.distributed.distributed_test.DistributedTest._DistTestBase`, run the way
PyTorch's test/distributed/test_distributed_spawn.py runs it (a fresh process per rank and test, a
file-based rendezvous), with dicomm registered as a plugin backend. One change: the ranks are forked
from a forkserver that imported torch, the suite and dicomm once, not spawned as new interpreters
(each of those spent ~3 s of CPU importing and ~1 s exiting, per rank and test, for test bodies that
mostly take under a second). A rank starts as a fork of a process that has made no group and run no
collective, with the environment the parent gave it for this test.

For dicomm the suite runs exactly as for gloo: the module is imported with BACKEND=gloo, so its
skip decorators and the gloo branches inside its tests are gloo's, and the groups it creates with
backend "gloo" are created on dicomm instead. So "every test gloo passes, dicomm passes" compares
the same test bodies. (Tests that assert the backend's name see "dicomm".) Not collected by
itself: test_torch_suite.py runs it per backend; spawned ranks import this file again and do the
same, through DICOMM_SUITE_BACKEND.
"""
from __future__ import annotations

import functools
import inspect
import os
from typing import Any, Callable

import torch.multiprocessing

REAL_BACKEND = os.environ.setdefault("DICOMM_SUITE_BACKEND", os.environ["BACKEND"])

if REAL_BACKEND == "dicomm":
    import torch.distributed as dist

    import dicomm  # noqa: F401  (registers the backend)
    os.environ["BACKEND"] = "gloo"  # gloo's selection and code paths

    def _on_dicomm(fn: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            # The backend may come by keyword or by position: either way gloo becomes dicomm.
            bound = signature.bind(*args, **kwargs)
            if bound.arguments.get("backend") == "gloo":
                bound.arguments["backend"] = "dicomm"
            return fn(*bound.args, **bound.kwargs)
        return wrapper

    for _name in ("init_process_group", "new_group", "new_subgroups", "new_subgroups_by_enumeration"):
        setattr(dist, _name, _on_dicomm(getattr(dist, _name)))

from torch.testing._internal.common_utils import run_tests  # noqa: E402
from torch.testing._internal.distributed import distributed_test  # noqa: E402
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest, TestDistBackend)


def _run_in_environ(environ: dict[str, str], run: Callable[..., None], *args: Any, **kwargs: Any) -> None:
    """A forked rank: the parent's environment of this test (the forkserver kept the one it started
    with), then the rank's test. distributed_test reads INIT_METHOD once at import (a spawned rank
    imports it after the parent's setUp named this test's directory), so it is read again here."""
    os.environ.clear()
    os.environ.update(environ)
    distributed_test.INIT_METHOD = os.getenv("INIT_METHOD", "env://")
    run(*args, **kwargs)


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()

    def _spawn_processes(self) -> None:
        context = torch.multiprocessing.get_context("forkserver")
        context.set_forkserver_preload([__name__])  # torch, the suite and the backend, imported once

        def process(target: Callable[..., None], name: str, args: tuple, kwargs: dict) -> Any:
            return context.Process(target=_run_in_environ, name=name, args=(dict(os.environ), target, *args),
                                   kwargs=kwargs)
        self._start_processes(process)


if __name__ == "__main__":
    run_tests()
