"""A bulk capture's part file (ditorch_precision.part_file): what is written reads back equal to the
tensors and values given (reference: the objects themselves, compared with torch.equal), views of one
storage stay views of one storage, and a damaged or forged file is refused with a message naming it,
never read out of bounds."""
import json
import struct

import pytest
import torch

from ditorch_precision.part_file import PartFile, PartFileError, write_part


def _payloads():
    g = torch.Generator().manual_seed(0)
    base = torch.randn(6, 5, generator=g)
    return {"0000001": {"args": [base, base.t(), base[2:4, 1:], (3, -1)], "kwargs": {"dtype": torch.bfloat16,
                                                                                  "device": torch.device("cpu")},
                        "outputs": (base.bfloat16(), torch.tensor([True, False]), torch.arange(5))},
            "0000002": {"args": [complex(1, 2), float("inf"), None, "mean"], "kwargs": {},
                        "outputs": [torch.empty(0), torch.randn(3, generator=g).to(torch.complex64)]}}


def _equal(x, y) -> None:
    if isinstance(x, torch.Tensor):
        assert isinstance(y, torch.Tensor) and x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)
        assert x.stride() == y.stride()
    elif isinstance(x, dict):
        assert isinstance(y, dict) and x.keys() == y.keys()
        for k in x:
            _equal(x[k], y[k])
    elif isinstance(x, (list, tuple)):
        assert type(x) is type(y) and len(x) == len(y)
        for a, b in zip(x, y):
            _equal(a, b)
    else:
        assert x == y and type(x) is type(y)


def test_part_file_reads_back_what_was_written(tmp_path):
    payloads = _payloads()
    write_part(payloads, str(tmp_path / "p.bin"))
    part = PartFile(str(tmp_path / "p.bin"))
    assert set(part.keys()) == set(payloads)
    for key, payload in payloads.items():
        _equal(payload, part[key])
    args = part["0000001"]["args"]  # the base, its transpose and a slice: one storage in the file
    assert args[0].untyped_storage().data_ptr() == args[1].untyped_storage().data_ptr() == \
        args[2].untyped_storage().data_ptr()


def _forge(tmp_path, header: dict, data: bytes = b"\0" * 64) -> str:
    raw = json.dumps(header).encode()
    raw += b" " * (-(8 + len(raw)) % 64)
    path = tmp_path / "forged.bin"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return str(path)


TENSOR = {"__precision__": "tensor", "storage": 0, "dtype": "float32", "view": [[4], [1], 0]}


@pytest.mark.parametrize("header,data,expected", [
    ({"format": "precision-part", "storages": [[0, 16]], "items": {"k": TENSOR}}, b"\0" * 64, None),
    ({"format": "other", "storages": [], "items": {}}, b"", "not a part file"),
    ({"format": "precision-part", "storages": [[0, 1 << 40]], "items": {}}, b"\0" * 64, "inside the 64 data bytes"),
    ({"format": "precision-part", "storages": [[3, 16]], "items": {}}, b"\0" * 64, "aligned to 64"),
    ({"format": "precision-part", "storages": [[0, 16]], "items": {"k": {**TENSOR, "storage": 1}}}, b"\0" * 64,
     "storage number below 1"),
    ({"format": "precision-part", "storages": [[0, 16]], "items": {"k": {**TENSOR, "dtype": "object"}}}, b"\0" * 64,
     "one of the dtypes"),
    ({"format": "precision-part", "storages": [[0, 16]], "items": {"k": {**TENSOR, "view": [[5], [1], 0]}}},
     b"\0" * 64, "reaches element 4 of a storage of 4"),
    ({"format": "precision-part", "storages": [[0, 16]], "items": {"k": {**TENSOR, "view": [[2], [-1], 3]}}},
     b"\0" * 64, "negative"),
])
def test_part_file_refuses_a_forged_header(tmp_path, header, data, expected):
    path = _forge(tmp_path, header, data)
    if expected is None:
        assert torch.equal(PartFile(path)["k"], torch.zeros(4))
        return
    with pytest.raises(PartFileError, match=expected) as err:
        PartFile(path)["k"]
    assert "forged.bin" in str(err.value)


def test_part_file_refuses_a_header_longer_than_the_file(tmp_path):
    path = tmp_path / "short.bin"
    path.write_bytes(struct.pack("<Q", 1 << 50) + b"{}")
    with pytest.raises(PartFileError, match="header length .* exceeds the file"):
        PartFile(str(path))
    path.write_bytes(b"\1\2")
    with pytest.raises(PartFileError, match="8-byte header length"):
        PartFile(str(path))
