"""The part file of a bulk capture (``tensors/partNNNNN.bin``): many ops' payloads in one file, each
storage's bytes once, laid out as safetensors lays out a checkpoint:

    8 bytes   little-endian length N of the header
    N bytes   JSON header: {"format": "precision-part", "storages": [[offset, nbytes], ...],
              "items": {key: payload}}, padded with spaces to a multiple of 64 bytes
    the rest  the storages' bytes, each at its offset (from the end of the header), 64-byte aligned

In a payload a tensor is {TAG: "tensor", "storage": i, "dtype": name, "view": [sizes, strides, offset]}
(offset and strides in elements of that dtype); a tuple is {TAG: "tuple", "items": [...]}, a dtype
{TAG: "dtype", "name": ...}, a device {TAG: "device", "name": ...}, a complex {TAG: "complex", "re", "im"}.

Writing one needs no pickling, and reading one maps the file and cuts tensors out of it, instead of
torch's safe unpickler rebuilding each tensor (about 0.7 ms a tensor). The file is data from elsewhere:
the header's length, every offset, size, dtype and view is checked against the file before use."""
from __future__ import annotations

import json
import os
import struct

import torch
from torch.utils._pytree import tree_flatten

TAG = "__precision__"  # the capture format's tag (ditorch_precision.dump.TAG)
FORMAT = "precision-part"
ALIGN = 64
_DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.complex64, torch.complex128,
    torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool,
    torch.float8_e4m3fn, torch.float8_e5m2)}
_HEADER_MAX = 1 << 30


class PartFileError(ValueError):
    """A part file that cannot be read; the message says what is wrong."""


def writable(payloads: dict) -> bool:
    """Whether every tensor of the payloads is a strided CPU tensor of a dtype this format names."""
    leaves, _ = tree_flatten(payloads)
    return all(not isinstance(x, torch.Tensor) or (x.layout == torch.strided and x.device.type == "cpu"
                                                  and str(x.dtype).removeprefix("torch.") in _DTYPES)
               for x in leaves)


def _pad(n: int) -> int:
    return -n % ALIGN


def write_part(payloads: dict, path: str) -> None:
    """Write ``{key: payload}`` (as held by a bulk capture; see ``writable``) to ``path``."""
    storages: dict[int, int] = {}  # storage address -> number
    blobs: list[torch.Tensor] = []
    layout: list[list[int]] = []
    end = 0

    def encode(x):
        nonlocal end
        if isinstance(x, torch.Tensor):
            storage = x.untyped_storage()
            number = storages.get(storage.data_ptr())
            if number is None:  # each storage once (only empty storages may share an address)
                number = storages[storage.data_ptr()] = len(blobs)
                blobs.append(torch.empty(0, dtype=torch.uint8).set_(storage))
                layout.append([end, storage.nbytes()])
                end += storage.nbytes() + _pad(storage.nbytes())
            return {TAG: "tensor", "storage": number, "dtype": str(x.dtype).removeprefix("torch."),
                    "view": [list(x.shape), list(x.stride()), x.storage_offset()]}
        if isinstance(x, tuple):
            return {TAG: "tuple", "items": [encode(v) for v in x]}
        if isinstance(x, list):
            return [encode(v) for v in x]
        if isinstance(x, dict):
            return {k: encode(v) for k, v in x.items()}
        if isinstance(x, torch.dtype):
            return {TAG: "dtype", "name": str(x).removeprefix("torch.")}
        if isinstance(x, torch.device):
            return {TAG: "device", "name": str(x)}
        if isinstance(x, complex):
            return {TAG: "complex", "re": x.real, "im": x.imag}
        return x

    items = {key: encode(payload) for key, payload in payloads.items()}
    header = json.dumps({"format": FORMAT, "storages": layout, "items": items}).encode()
    header += b" " * _pad(8 + len(header))
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)))
        f.write(header)
        for blob, (_, nbytes) in zip(blobs, layout):
            f.write(memoryview(blob.numpy()))
            f.write(b"\0" * _pad(nbytes))


class PartFile:
    """A part file opened for reading: ``load(key)`` is that op's payload, its tensors cut out of the
    mapped file (read-only in effect: copies-on-write, never written back)."""

    def __init__(self, path: str) -> None:
        self.path = path
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                raise PartFileError(f"{path}: {size} bytes; a part file starts with an 8-byte header length")
            (n,) = struct.unpack("<Q", raw)
            if n > min(size - 8, _HEADER_MAX):
                raise PartFileError(f"{path}: header length {n} exceeds the file ({size} bytes)")
            try:
                header = json.loads(f.read(n))
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise PartFileError(f"{path}: header is not JSON ({exc})") from exc
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            got = header.get("format") if isinstance(header, dict) else header
            raise PartFileError(f"{path}: not a part file (format {got!r:.40}, expected {FORMAT!r})")
        start, data = 8 + n, size - 8 - n
        storages, items = header.get("storages"), header.get("items")
        if not isinstance(storages, list) or not isinstance(items, dict):
            raise PartFileError(f"{path}: header needs 'storages' (a list) and 'items' (an object)")
        for i, s in enumerate(storages):
            if not (isinstance(s, list) and len(s) == 2 and all(isinstance(v, int) and not isinstance(v, bool)
                                                                 and v >= 0 for v in s) and s[0] + s[1] <= data
                    and (start + s[0]) % ALIGN == 0):
                raise PartFileError(f"{path}: storage {i} is {s!r:.60}; expected [offset, nbytes], aligned to "
                                    f"{ALIGN}, inside the {data} data bytes")
        self._storages, self._items, self._start = storages, items, start
        self._file = torch.UntypedStorage.from_file(path, shared=False, nbytes=size) if size else None
        self._bytes = torch.empty(0, dtype=torch.uint8).set_(self._file) if size else torch.empty(0, dtype=torch.uint8)

    def keys(self):
        return self._items.keys()

    def __getitem__(self, key: str):
        return self.load(key)

    def load(self, key: str):
        if key not in self._items:
            raise KeyError(key)
        return self._decode(self._items[key], key)

    def _decode(self, x, key: str):
        if isinstance(x, list):
            return [self._decode(v, key) for v in x]
        if not isinstance(x, dict):
            return x
        kind = x.get(TAG)
        if kind == "tensor":
            return self._tensor(x, key)
        if kind == "tuple" and isinstance(x.get("items"), list):
            return tuple(self._decode(v, key) for v in x["items"])
        if kind == "dtype" and x.get("name") in _DTYPES:
            return _DTYPES[x["name"]]
        if kind == "device" and isinstance(x.get("name"), str):
            try:
                return torch.device(x["name"])
            except RuntimeError as exc:
                raise PartFileError(f"{self.path}: item {key!r}: bad device {x['name']!r:.40}") from exc
        if kind == "complex" and all(isinstance(x.get(k), (int, float)) for k in ("re", "im")):
            return complex(x["re"], x["im"])
        if kind in ("tensor", "tuple", "dtype", "device", "complex"):
            raise PartFileError(f"{self.path}: item {key!r}: bad {kind} entry {x!r:.80}")
        return {k: self._decode(v, key) for k, v in x.items()}

    def _tensor(self, x: dict, key: str) -> torch.Tensor:
        where = f"{self.path}: item {key!r}"
        i, dtype = x.get("storage"), _DTYPES.get(x.get("dtype"))  # type: ignore[arg-type]
        if not (isinstance(i, int) and not isinstance(i, bool) and 0 <= i < len(self._storages)) or dtype is None:
            raise PartFileError(f"{where}: bad tensor entry {x!r:.80}; expected a storage number below "
                                f"{len(self._storages)} and one of the dtypes {', '.join(_DTYPES)}")
        offset, nbytes = self._storages[i]
        size = torch.empty(0, dtype=dtype).element_size()
        raw = self._bytes[self._start + offset: self._start + offset + nbytes - nbytes % size]
        return view_of(raw.view(dtype), x.get("view"), where)


def view_of(base: torch.Tensor, view, where: str) -> torch.Tensor:
    """The tensor (size, stride, offset) on ``base``'s elements (from ``base``'s own start); refused
    unless it lies inside them."""
    def ints(v) -> bool:
        return isinstance(v, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in v)

    if not (isinstance(view, list) and len(view) == 3 and ints(view[0]) and ints(view[1])
            and len(view[0]) == len(view[1]) and isinstance(view[2], int) and not isinstance(view[2], bool)):
        raise PartFileError(f"{where}: bad view {view!r:.80}; expected [sizes], [strides] and an offset")
    size, stride, offset = view
    n = base.numel()
    if any(d < 0 for d in size) or any(st < 0 for st in stride) or offset < 0:
        raise PartFileError(f"{where}: bad view {view!r:.80}: negative sizes, strides or offset")
    last = offset + sum((d - 1) * st for d, st in zip(size, stride)) if all(size) else offset - 1
    if last >= n:
        raise PartFileError(f"{where}: view {view!r:.80} reaches element {last} of a storage of {n}")
    return torch.as_strided(base, size, stride, base.storage_offset() + offset)
