"""Scratch tensors a kernel requires through ``ctx->require_tensor`` live until its call returns, also
when another thread calls the library meanwhile. A C library whose neg requires a scratch tensor and then
waits until the test says go; the other thread's exp (no scratch) runs in between."""
from __future__ import annotations

import threading
import time

import torch

from diopi_testlib import METADATA_C, compile_c_library

SOURCE = METADATA_C % {"abi": "DIOPI_ABI_VERSION"} + r"""
#include <stdatomic.h>
static atomic_int required = 0, go = 0;
int test_required(void) { return atomic_load(&required); }
void test_go(void) { atomic_store(&go, 1); }
diopiError_t diopi_aten_neg(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t self) {
    diopiTensorHandle_t scratch = 0;
    int64_t shape[1] = {1 << 20};
    diopiError_t code = ctx->require_tensor(ctx->allocator_state, &scratch, 1, shape, DIOPI_DTYPE_FLOAT64);
    if (code != DIOPI_SUCCESS) return code;
    atomic_store(&required, 1);
    while (!atomic_load(&go)) {}
    return DIOPI_SUCCESS;
}
diopiError_t diopi_aten_exp(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t self) {
    return DIOPI_SUCCESS;
}
"""


def test_scratch_is_dropped_when_its_call_returns_while_another_thread_calls(tmp_path):
    from diopi_bindings.library import DiopiLibrary

    lib = DiopiLibrary(compile_c_library(tmp_path, "scratch", SOURCE))
    dll = lib._dll
    x, y = torch.zeros(4), torch.zeros(4)
    held: list[bool] = []

    def with_scratch() -> None:
        lib.call("aten::neg", y, x)
        held.append(lib.allocator.holds_required())  # this thread's scratch, after its call returned

    worker = threading.Thread(target=with_scratch, daemon=True)
    worker.start()
    deadline = time.monotonic() + 60
    try:
        while not dll.test_required():  # the kernel holds its scratch tensor now
            assert time.monotonic() < deadline, "the kernel never required its scratch tensor"
            time.sleep(0.001)
        lib.call("aten::exp", y, x)  # another call, on this thread, while that one runs
    finally:
        dll.test_go()  # the kernel never waits past the test
    worker.join(timeout=60)
    assert held == [False], "the scratch tensor outlived its call"
