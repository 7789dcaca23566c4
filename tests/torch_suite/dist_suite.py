"""PyTorch's own distributed test suite, on the backend named by the BACKEND variable.

`torch.testing._internal.distributed.distributed_test.DistributedTest._DistTestBase`, run the way
PyTorch's test/distributed/test_distributed_spawn.py runs it (one spawned process per rank, a
file-based rendezvous), with dicomm registered as a plugin backend.

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
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest, TestDistBackend)


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()


if __name__ == "__main__":
    run_tests()
