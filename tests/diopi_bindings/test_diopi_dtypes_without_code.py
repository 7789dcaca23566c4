"""Tensors whose dtype the DIOPI ABI has no code for (uint8, int8, int16, complex): an operator the
library implements for other dtypes cannot take them, so it runs on the CPU, as an operator the library
lacks does. Reference: the same calls on CPU tensors."""
from __future__ import annotations

import pytest

from diopi_testlib import run_python

CHECKS = """
        cases = {
            "uint8 add (wraps)": lambda t: t(torch.tensor([200, 7, 0], dtype=torch.uint8))
            + t(torch.tensor([100, 1, 255], dtype=torch.uint8)),
            "int8 mul": lambda t: t(torch.tensor([-100, 3, 12], dtype=torch.int8))
            * t(torch.tensor([2, -5, 11], dtype=torch.int8)),
            "int16 sum": lambda t: t(torch.arange(-300, 300, 7, dtype=torch.int16)).sum(dim=0),
            "uint8 fill_": lambda t: t(torch.zeros(5, dtype=torch.uint8)).fill_(9),
            "uint8 clone of a transpose": lambda t: t(torch.arange(12, dtype=torch.uint8).reshape(3, 4)).t().clone(),
            "complex64 mul": lambda t: t(torch.tensor([1 + 2j, -3j], dtype=torch.complex64))
            * t(torch.tensor([2 - 1j, 4 + 1j], dtype=torch.complex64)),
            "nonzero of uint8": lambda t: torch.nonzero(t(torch.tensor([[0, 3], [5, 0]], dtype=torch.uint8))),
            "masked_select of uint8": lambda t: torch.masked_select(t(torch.tensor([4, 5, 6], dtype=torch.uint8)),
                                                                    t(torch.tensor([True, False, True]))),
            "index by a bool mask, int8 values": lambda t: t(torch.tensor([-1, 2, -3, 4], dtype=torch.int8))[
                t(torch.tensor([True, True, False, True]))],
        }
        results = {}
        for name, case in cases.items():
            want = case(lambda x: x)
            try:
                got = case(lambda x: x.to("diopi"))
                same = got.dtype == want.dtype and torch.equal(got.cpu(), want)
                results[name] = bool(got.device.type == "diopi" and same)
            except Exception as exc:
                results[name] = f"{type(exc).__name__}: {exc}"
        print(json.dumps(results))
"""


@pytest.mark.parametrize("backend", ["native", "python"])
def test_dtypes_without_a_diopi_code_run_on_the_cpu(reference_path, backend):
    got = run_python(f"""
        import json, torch
        from diopi_bindings import device
        device.enable({str(reference_path)!r}, backend={backend!r})
{CHECKS}
    """)
    got.pop("_stderr")
    assert {name: ok for name, ok in got.items() if ok is not True} == {}, got


def test_conjugate_and_negative_views_copy_to_and_from_the_native_device(reference_path):
    """A complex tensor's conjugate view copied between the native device and the CPU, within the device
    and into a conjugate view: the values torch gives on CPU tensors.
    The copy reached the device's _copy_from through torch's conjugate fallback, which resolved the view
    with a clone that copies through _copy_from again, without end (a crash)."""
    got = run_python(f"""
        import json, torch
        from diopi_bindings import device
        device.enable({str(reference_path)!r}, backend="native")
        z = torch.tensor([[1 + 2j, 3 - 4j, -5j], [0.5, -1 + 1j, 2j]], dtype=torch.complex64)
        d = z.to("diopi")
        cases = {{
            "conj to cpu": (lambda: d.conj().cpu(), z.conj()),
            "conj of a transpose to cpu": (lambda: d.t().conj().cpu(), z.t().conj()),
            "conj cpu to device": (lambda: z.conj().to("diopi").cpu(), z.conj()),
            "conj within the device": (lambda: d.conj().clone().cpu(), z.conj()),
            "conj to the other device": (lambda: d.conj().to("diopi:1").cpu(), z.conj()),
            "into a conj view": (lambda: torch.zeros_like(d).conj().copy_(d).resolve_conj().cpu(), z),
        }}
        results = {{}}
        for name, (run, want) in cases.items():
            try:
                got = run().resolve_conj().resolve_neg()
                results[name] = bool(torch.equal(got, want.resolve_conj().resolve_neg()))
            except Exception as exc:
                results[name] = f"{{type(exc).__name__}}: {{exc}}"
        print(json.dumps(results))
    """)
    got.pop("_stderr")
    assert {name: ok for name, ok in got.items() if ok is not True} == {}, got


def test_views_in_another_dtype_on_the_native_device(reference_path):
    """Views that read the same bytes as another dtype (view_as_real, .real/.imag of a complex tensor,
    view(dtype) to a wider or narrower dtype), also of a tensor at a storage offset: the values torch
    gives on CPU tensors, and a write through the view reaches the base. They were made as_strided of
    the base in the base's dtype, with the view's sizes and strides (out of bounds, or other values)."""
    got = run_python(f"""
        import json, torch
        from diopi_bindings import device
        device.enable({str(reference_path)!r}, backend="native")
        z = torch.tensor([[1 + 2j, 3 - 4j, -5j], [0.5, -1 + 1j, 2j]], dtype=torch.complex64)
        f = torch.arange(12, dtype=torch.float32) - 5.5
        zd, fd = z.to("diopi"), f.to("diopi")
        cases = {{
            "view_as_real": (lambda t: torch.view_as_real(t(z)), None),
            "imag": (lambda t: t(z).imag, None),
            "real of a row": (lambda t: t(z)[1].real, None),
            "imag of a conj": (lambda t: t(z).conj().imag, None),
            "float32 as int32": (lambda t: t(f).view(torch.int32), None),
            "float32 at an offset as uint8": (lambda t: t(f)[3:].view(torch.uint8), None),
            "uint8 as float32": (lambda t: t(f).view(torch.uint8)[8:].view(torch.float32), None),
            "float32 as complex64": (lambda t: torch.view_as_complex(t(f).view(6, 2)), None),
        }}
        results = {{}}
        for name, (case, _) in cases.items():
            want = case(lambda x: x.clone())
            try:
                got = case(lambda x: x.to("diopi"))
                same = got.dtype == want.dtype and got.shape == want.shape
                results[name] = bool(same and torch.equal(got.cpu().resolve_neg(), want.resolve_neg()))
            except Exception as exc:
                results[name] = f"{{type(exc).__name__}}: {{exc}}"[:300]
        base = f.clone().to("diopi")
        base[2:].view(torch.int32).fill_(7)   # a write through the view reaches its base
        want = f.clone()
        want[2:].view(torch.int32).fill_(7)
        results["write through"] = bool(torch.equal(base.cpu().view(torch.int32), want.view(torch.int32)))
        print(json.dumps(results))
    """)
    got.pop("_stderr")
    assert {name: ok for name, ok in got.items() if ok is not True} == {}, got
