"""Conformance of the optional device-memory functions (``diopirt.h``): byte-exact round trips
host -> device -> host and across devices, copies at an offset that leave their neighbours alone,
and refusals (a device index out of range, a free of memory the library did not allocate on that
device, a double free) as error codes. The reference is the host bytes themselves."""
from __future__ import annotations

from collections.abc import Callable

import torch

from diopi_bindings.conformance.runner import ERROR, FAIL, NOT_IMPLEMENTED, PASS, CaseResult
from diopi_bindings.device_memory import DeviceMemory
from diopi_bindings.library import DiopiLibrary, OperatorError

RUNTIME_OP = "diopi::device_memory"
SIZES = (1, 7, 4096, (1 << 20) + 3)


def _bytes(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g)


class _Refused(Exception):
    pass


def _round_trip(mem: DeviceMemory, device: int, data: torch.Tensor) -> torch.Tensor:
    ptr = mem.malloc(device, data.numel())
    try:
        mem.memcpy_h2d(device, ptr, data.data_ptr(), data.numel())
        back = torch.empty_like(data)
        mem.memcpy_d2h(device, back.data_ptr(), ptr, data.numel())
        return back
    finally:
        mem.free(device, ptr)


def _refused(call: Callable[[], object], what: str) -> None:
    try:
        call()
    except OperatorError:
        return
    raise _Refused(f"{what} was accepted (expected an error code)")


def _cases(mem: DeviceMemory) -> list[tuple[str, Callable[[], None]]]:
    count = mem.device_count()
    devices = list(range(count))
    other = 1 if count > 1 else 0

    def count_positive() -> None:
        if count < 1:
            raise _Refused(f"diopi_device_count reports {count} devices")

    def set_get() -> None:
        before = mem.get_device()
        try:
            for d in devices:
                mem.set_device(d)
                if mem.get_device() != d:
                    raise _Refused(f"set_device({d}) then get_device() gave {mem.get_device()}")
        finally:
            mem.set_device(before)

    def round_trips() -> None:
        for d in devices:
            for i, n in enumerate(SIZES):
                data = _bytes(n, 100 * d + i)
                back = _round_trip(mem, d, data)
                if not torch.equal(back, data):
                    bad = int((back != data).sum())
                    raise _Refused(f"device {d}, {n} bytes: {bad} byte(s) differ after host -> device -> host")

    def zero_bytes() -> None:
        for d in devices:
            ptr = mem.malloc(d, 0)
            mem.free(d, ptr)

    def cross_device() -> None:
        n = 65536 + 5
        data = _bytes(n, 7)
        a, b = mem.malloc(0, n), mem.malloc(other, n)
        try:
            mem.memcpy_h2d(0, a, data.data_ptr(), n)
            mem.memcpy_d2d(other, b, 0, a, n)
            back = torch.empty_like(data)
            mem.memcpy_d2h(other, back.data_ptr(), b, n)
            if not torch.equal(back, data):
                raise _Refused(f"device 0 -> device {other}: {int((back != data).sum())} byte(s) differ")
        finally:
            mem.free(0, a)
            mem.free(other, b)

    def at_offset() -> None:
        n, offset, length = 1024, 100, 300
        base, patch = _bytes(n, 11), _bytes(length, 12)
        ptr = mem.malloc(0, n)
        try:
            mem.memcpy_h2d(0, ptr, base.data_ptr(), n)
            mem.memcpy_h2d(0, ptr + offset, patch.data_ptr(), length)
            back = torch.empty_like(base)
            mem.memcpy_d2h(0, back.data_ptr(), ptr, n)
            want = base.clone()
            want[offset:offset + length] = patch
            if not torch.equal(back, want):
                raise _Refused(f"a copy to offset {offset}: {int((back != want).sum())} byte(s) differ")
        finally:
            mem.free(0, ptr)

    def out_of_range() -> None:
        _refused(lambda: mem.set_device(count), f"set_device({count}) with {count} device(s)")
        _refused(lambda: mem.set_device(-1), "set_device(-1)")
        _refused(lambda: mem.malloc(count, 16), f"malloc on device {count}")
        _refused(lambda: mem.synchronize(count), f"synchronize({count})")

    def foreign_free() -> None:
        host = torch.empty(64, dtype=torch.uint8)
        _refused(lambda: mem.free(0, host.data_ptr()), "free of host memory the library did not allocate")
        ptr = mem.malloc(0, 64)
        if count > 1:
            _refused(lambda: mem.free(1, ptr), "free on device 1 of memory allocated on device 0")
        mem.free(0, ptr)
        _refused(lambda: mem.free(0, ptr), "a double free")

    def synchronize() -> None:
        for d in devices:
            mem.synchronize(d)

    return [("device count", count_positive), ("set/get device", set_get), ("round trip", round_trips),
            ("zero bytes", zero_bytes), (f"device 0 -> {other}", cross_device), ("offset copy", at_offset),
            ("out-of-range device refused", out_of_range), ("foreign free refused", foreign_free),
            ("synchronize", synchronize)]


def run_device_memory(lib: DiopiLibrary) -> list[CaseResult]:
    missing = DeviceMemory.missing(lib)
    if missing:
        detail = f"{lib.vendor} does not export {', '.join(missing)}"
        return [CaseResult(RUNTIME_OP, "*", "bytes", NOT_IMPLEMENTED, detail)]
    mem = DeviceMemory.of(lib)
    assert mem is not None
    try:
        cases = _cases(mem)
    except OperatorError as exc:
        return [CaseResult(RUNTIME_OP, "device count", "bytes", ERROR, str(exc))]
    results = []
    for label, check in cases:
        result = CaseResult(RUNTIME_OP, label, "bytes", PASS)
        try:
            check()
        except _Refused as exc:
            result.status, result.detail = FAIL, str(exc)
        except OperatorError as exc:
            result.status, result.detail = ERROR, str(exc)
        results.append(result)
    return results
