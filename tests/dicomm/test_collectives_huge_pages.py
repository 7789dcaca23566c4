"""A large all_reduce between ranks of one host folds the ranks' buffers into transparent huge pages, so
cross-memory attach pins one page per 2 MiB whatever allocator the user's tensors came from (torch's
default gives 4 KiB pages). Checked in the kernel's own account of each rank's mapping (smaps)."""
from __future__ import annotations

import os

import pytest
import torch

from tests.dicomm.collectives_util import close_comm, open_comm
from tests.dicomm.multiproc import run_ranks

pytest.importorskip("dicomm._C")

MIB = 1 << 20


def _kernel_collapses() -> bool:
    major, minor = (int(x) for x in os.uname().release.split(".")[:2])
    return (major, minor) >= (6, 1)  # MADV_COLLAPSE


def _huge_kib(address: int) -> int:
    """AnonHugePages of the mapping that holds `address`, in KiB."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(" ", 1)[0]
            if "-" in head and not head.endswith(":"):
                start, end = (int(x, 16) for x in head.split("-"))
                inside = start <= address < end
            elif inside and head == "AnonHugePages:":
                return int(line.split()[1])
    return 0


def _two_calls(rank, world, store):
    comm = open_comm(rank, world, store)
    buf = torch.full((8 * MIB // 4,), float(rank + 1))  # 4 KiB pages: THP_MEM_ALLOC_ENABLE is off
    before = _huge_kib(buf.data_ptr())
    for _ in range(2):  # the first call folds it, the second finds it folded
        buf.fill_(float(rank + 1))
        comm.all_reduce(buf.data_ptr(), buf.numel(), "float32", "sum").wait()
    after = _huge_kib(buf.data_ptr())
    exact = bool(torch.all(buf == float(world * (world + 1) // 2)))
    close_comm(comm)
    return before, after, exact


@pytest.mark.skipif(not _kernel_collapses(), reason="the kernel predates MADV_COLLAPSE (Linux 6.1)")
@pytest.mark.parametrize("world", [2, 3])
def test_a_reused_all_reduce_buffer_ends_up_in_huge_pages(world):
    results = run_ranks(_two_calls, world, timeout=120, env={"THP_MEM_ALLOC_ENABLE": "0"})
    for rank, (before, after, exact) in enumerate(results):
        assert exact, f"rank {rank}: wrong sum"
        assert before == 0, f"rank {rank}: the buffer was in huge pages before ({before} KiB)"
        assert after >= 6 * 1024, f"rank {rank}: {after} KiB of its 8 MiB buffer in huge pages"
