"""The reduction kernels behind reduce / all_reduce / reduce_scatter, called directly through
`dicomm._C.reduce_into(dst, src, count, dtype, op)` (dst = op(dst, src)) and compared with torch's
own element-wise ops on the same inputs: torch is the reference, including integer wrap-around,
NaN propagation of min/max, and float16/bfloat16 rounding (computed in float32, rounded to
nearest even). One process; no communication involved.
"""
from __future__ import annotations

import pytest
import torch

from tests.dicomm.collectives_util import DTYPES, FLOAT_DTYPES, OPS, TORCH_DTYPES, same, valid

_C = pytest.importorskip("dicomm._C")

TORCH_OPS = {
    "sum": torch.add, "product": torch.mul, "min": torch.minimum, "max": torch.maximum,
    "band": torch.bitwise_and, "bor": torch.bitwise_or, "bxor": torch.bitwise_xor,
}
SIZES = [1, 7, 8, 9, 513, 4099]  # vector bodies and scalar tails of every width


def reduce_into(dst: torch.Tensor, src: torch.Tensor, dtype: str, op: str) -> torch.Tensor:
    _C.reduce_into(dst.data_ptr(), src.data_ptr(), dst.numel(), dtype, op)
    return dst


def random_values(dtype: str, n: int, gen: torch.Generator) -> torch.Tensor:
    """Any bit pattern of the dtype: NaNs, infinities, subnormals, extremes included."""
    t = TORCH_DTYPES[dtype]
    if dtype == "bool":
        return torch.randint(0, 2, (n,), generator=gen).bool()
    nbytes = torch.empty(0, dtype=t).element_size()
    raw = torch.randint(0, 256, (n * nbytes,), generator=gen, dtype=torch.uint8)
    return raw.view(t).clone()


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_op_matches_torch_on_arbitrary_bit_patterns(dtype):
    gen = torch.Generator().manual_seed(7)
    for op in OPS:
        if op == "avg" or not valid(dtype, op):
            continue
        for n in SIZES:
            a, b = random_values(dtype, n, gen), random_values(dtype, n, gen)
            expected = TORCH_OPS[op](a, b)
            got = reduce_into(a.clone(), b, dtype, op)
            assert same(got, expected), f"{op} on {dtype} x {n}: {got[:8]} vs {expected[:8]}"


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_special_values(dtype):
    t = TORCH_DTYPES[dtype]
    big = torch.finfo(t).max
    tiny = torch.finfo(t).tiny / 4  # subnormal
    vals = [0.0, -0.0, 1.0, -1.0, float("inf"), float("-inf"), float("nan"), big, -big, tiny, 3.5]
    a = torch.tensor([x for x in vals for _ in vals], dtype=t)
    b = torch.tensor([y for _ in vals for y in vals], dtype=t)
    for op in ("sum", "product", "min", "max"):
        got = reduce_into(a.clone(), b, dtype, op)
        expected = TORCH_OPS[op](a, b)
        assert same(got, expected), f"{op} on {dtype}: {got} vs {expected}"
    # NaN on either side wins min and max.
    nan_mask = torch.isnan(a) | torch.isnan(b)
    assert torch.isnan(reduce_into(a.clone(), b, dtype, "min")[nan_mask]).all()
    assert torch.isnan(reduce_into(a.clone(), b, dtype, "max")[nan_mask]).all()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_types_round_to_nearest_even(dtype):
    t = TORCH_DTYPES[dtype]
    mant = 10 if dtype == "float16" else 7
    # 1 + k * 2^-(mant+1) lies exactly halfway between two neighbours for odd k: ties to even.
    a = torch.ones(64, dtype=t)
    b = (torch.arange(64, dtype=torch.float64) * 2.0 ** -(mant + 1)).to(t)
    exact = (a.double() + b.double()).to(t)  # exact in float64, rounded once
    got = reduce_into(a.clone(), b, dtype, "sum")
    assert same(got, exact) and same(got, torch.add(a, b))
    # Nudged just above the ties, odd k round up instead: the ties really were decided by evenness.
    assert not same(got, (a.double() + b.double() + 2.0 ** -20).to(t))
    # Overflow rounds to infinity, like torch.
    big = torch.full((8,), torch.finfo(t).max, dtype=t)
    assert torch.isinf(reduce_into(big.clone(), big, dtype, "sum")).all()


@pytest.mark.parametrize("dtype", ["int8", "int16", "int32", "int64", "uint8"])
def test_integer_overflow_wraps(dtype):
    t = TORCH_DTYPES[dtype]
    info = torch.iinfo(t)
    a = torch.tensor([info.max, info.min, info.max, -1 if info.min < 0 else 1], dtype=t)
    b = torch.tensor([1, -1 if info.min < 0 else 0, info.max, info.min if info.min < 0 else 255],
                     dtype=t)
    bits = info.bits
    for op, fn in (("sum", lambda x, y: x + y), ("product", lambda x, y: x * y)):
        # Python's unbounded integers, reduced modulo 2^bits: independent of torch and dicomm.
        wrapped = []
        for x, y in zip(a.tolist(), b.tolist()):
            v = fn(x, y) % (1 << bits)
            wrapped.append(v - (1 << bits) if info.min < 0 and v >= 1 << (bits - 1) else v)
        got = reduce_into(a.clone(), b, dtype, op)
        assert got.tolist() == wrapped, f"{op} on {dtype}"


def test_in_place_with_itself():
    x = torch.arange(-50, 50, dtype=torch.float32)
    assert torch.equal(reduce_into(x.clone(), x.clone(), "float32", "sum"), x * 2)
    y = x.clone()
    _C.reduce_into(y.data_ptr(), y.data_ptr(), y.numel(), "float32", "product")
    assert torch.equal(y, x * x)


def test_bool_ops_are_logical():
    a = torch.tensor([0, 0, 1, 1], dtype=torch.bool)
    b = torch.tensor([0, 1, 0, 1], dtype=torch.bool)
    table = {"sum": [0, 1, 1, 1], "max": [0, 1, 1, 1], "bor": [0, 1, 1, 1],
             "product": [0, 0, 0, 1], "min": [0, 0, 0, 1], "band": [0, 0, 0, 1],
             "bxor": [0, 1, 1, 0]}
    for op, want in table.items():
        assert reduce_into(a.clone(), b, "bool", op).tolist() == [bool(v) for v in want], op


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("op", ["band", "bor", "bxor"])
def test_bitwise_op_on_float_is_rejected(dtype, op):
    x = torch.zeros(4, dtype=TORCH_DTYPES[dtype])
    with pytest.raises(ValueError, match=rf"'{op}'.*'{dtype}'"):
        reduce_into(x, x.clone(), dtype, op)


def test_unknown_names_and_avg_are_rejected():
    x = torch.zeros(4)
    with pytest.raises(ValueError, match="unknown dtype 'float8'"):
        _C.reduce_into(x.data_ptr(), x.data_ptr(), 4, "float8", "sum")
    with pytest.raises(ValueError, match="unknown reduce op 'mean'"):
        _C.reduce_into(x.data_ptr(), x.data_ptr(), 4, "float32", "mean")
    with pytest.raises(ValueError, match="avg"):
        _C.reduce_into(x.data_ptr(), x.data_ptr(), 4, "float32", "avg")


def test_portable_kernels_match_torch_too():
    """The kernels for CPUs without AVX2/F16C (software float16 conversion), forced on this one."""
    import os
    import subprocess
    import sys

    code = (
        "import torch, sys\n"
        "sys.path.insert(0, '.')\n"
        "from dicomm import _C\n"
        "from tests.dicomm.test_collectives_kernels import random_values, TORCH_OPS\n"
        "from tests.dicomm.collectives_util import DTYPES, OPS, same, valid\n"
        "assert _C.reduce_kernel_isa() == 'generic'\n"
        "g = torch.Generator().manual_seed(3)\n"
        "for d in DTYPES:\n"
        "  for op in OPS:\n"
        "    if op == 'avg' or not valid(d, op): continue\n"
        "    a, b = random_values(d, 4099, g), random_values(d, 4099, g)\n"
        "    x = a.clone(); _C.reduce_into(x.data_ptr(), b.data_ptr(), x.numel(), d, op)\n"
        "    assert same(x, TORCH_OPS[op](a, b)), (d, op)\n"
        "print('ok')\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, DICOMM_REDUCE_KERNELS="generic")
    out = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
