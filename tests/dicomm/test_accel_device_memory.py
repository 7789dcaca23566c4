"""The accelerator half of the verbs transport, which needs no NIC: device-pointer classification, dma-buf
export of a device allocation (what device-direct RDMA hands the NIC) and the staging copies of the
CPU-mediated path, all run from a thread that never touched the device (like dicomm's progress thread).
Checked against torch's own view of the same memory. The CUDA part runs where CUDA is present.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from dicomm import _C

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error where no CUDA driver is loaded")
def test_staging_without_a_driver_says_so() -> None:
    a, b = np.arange(16, dtype=np.uint8), np.zeros(16, dtype=np.uint8)
    with pytest.raises(RuntimeError, match="no accelerator driver"):
        _C._accel_check(a.ctypes.data, b.ctypes.data, 16)


@needs_cuda
@pytest.mark.parametrize("offset", [0, 4096 + 12])
def test_device_buffer_exports_and_stages_from_another_thread(offset: int) -> None:
    n = 1 << 20
    whole = torch.randint(0, 256, (offset + n + 100,), dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    dev = whole[offset:offset + n]
    host = np.zeros(n, dtype=np.uint8)
    got = _C._accel_check(dev.data_ptr(), host.ctypes.data, n)
    assert got["driver"] == 1 and got["device_is_device"] == 1 and got["host_is_device"] == 0, got
    assert np.array_equal(host, dev.cpu().numpy()), "device -> host staging copy differs from torch's copy"
    if got["dmabuf_fd"] >= 0:  # the allocation exported: the buffer sits at its offset inside the dma-buf
        assert got["dmabuf_offset"] >= offset
        assert got["dmabuf_size"] >= got["dmabuf_offset"] + n, got
    print("dma-buf export:", "ok" if got["dmabuf_fd"] >= 0 else "refused by the driver", got)

    before = whole.cpu()
    pattern = np.random.default_rng(offset).integers(0, 256, n, dtype=np.uint8)
    _C._accel_check(dev.data_ptr(), pattern.ctypes.data, n, to_device=True)
    torch.cuda.synchronize()
    after = whole.cpu()
    assert np.array_equal(after[offset:offset + n].numpy(), pattern), "host -> device staging copy differs"
    assert torch.equal(after[:offset], before[:offset]) and torch.equal(after[offset + n:], before[offset + n:]), \
        "the copy wrote outside the buffer"
