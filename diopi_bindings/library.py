"""Loading an operator library that exports the DIOPI ABI, and calling its operators from Python."""
from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from diopi_bindings import abi
from diopi_bindings.schema import OPS, OpSchema

if TYPE_CHECKING:
    import torch

LIBRARY_ENV = "DIOPI_LIBRARY"
_REQUIRED = ("diopi_abi_version", "diopi_vendor_name", "diopi_impl_version", "diopi_last_error")

_ARG_TYPES = {
    "out": ctypes.c_void_p, "out?": ctypes.c_void_p, "inout": ctypes.c_void_p, "in": ctypes.c_void_p,
    "in?": ctypes.c_void_p, "double": ctypes.c_double, "int": ctypes.c_int64, "bool": ctypes.c_bool,
    "ints": abi.Size, "in[]": abi.TensorList, "in?[]": abi.TensorList, "out*": ctypes.c_void_p,
}


# How call() passes each argument (identity-compared markers).
_TENSOR, _OPTIONAL_TENSOR, _TENSOR_LIST, _INTS, _SCALAR = "tensor", "optional tensor", "tensors", "ints", "scalar"
_OPTIONAL_TENSOR_LIST = "optional tensors"
_ALLOCATED = "allocated by the kernel"


class LibraryError(RuntimeError):
    """A library that cannot be used: missing, not a DIOPI library, or built for another ABI."""


class OperatorError(RuntimeError):
    """An operator call that returned an error code."""

    def __init__(self, op: str, code: int, message: str) -> None:
        self.op, self.code = op, code
        super().__init__(f"{op} failed ({abi.ERROR_NAMES.get(code, f'code {code}')}): {message or 'no message'}")


@dataclass(frozen=True)
class LibraryInfo:
    path: str
    vendor: str
    version: str
    abi_version: int
    implemented: tuple[str, ...]
    missing: tuple[str, ...]


class DiopiLibrary:
    """A loaded library: ``call(op, *args)`` runs one operator with torch tensors as arguments."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = str(path)
        if not Path(self.path).is_file():
            raise LibraryError(f"DIOPI library {self.path!r} does not exist")
        try:
            self._dll = ctypes.CDLL(self.path, mode=os.RTLD_LOCAL | os.RTLD_NOW)
        except OSError as exc:
            if "undefined symbol: diopi" not in str(exc) or not _export_deeplink_runtime():
                raise LibraryError(f"cannot load DIOPI library {self.path!r}: {exc}") from None
            # A library whose operators are DeepLink's DIOPI too (its runtime and its kernels in one file)
            # references the DIOPI runtime functions: they are global now.
            try:
                self._dll = ctypes.CDLL(self.path, mode=os.RTLD_LOCAL | os.RTLD_NOW)
            except OSError as again:
                raise LibraryError(f"cannot load DIOPI library {self.path!r}: {again}") from None
        missing = [name for name in _REQUIRED if not hasattr(self._dll, name)]
        if missing:
            raise LibraryError(
                f"{self.path} is not a DIOPI library: it does not export {', '.join(missing)} "
                f"(every library must define the functions declared in diopi/diopirt.h)"
            )
        self._dll.diopi_abi_version.restype = ctypes.c_uint32
        for name in _REQUIRED[1:]:
            getattr(self._dll, name).restype = ctypes.c_char_p
        self.abi_version = int(self._dll.diopi_abi_version())
        if self.abi_version != abi.ABI_VERSION:
            raise LibraryError(
                f"{self.path} was built for DIOPI ABI {self.abi_version}, this framework speaks ABI "
                f"{abi.ABI_VERSION}: rebuild the library against this diopi/diopirt.h"
            )
        self.vendor = self._dll.diopi_vendor_name().decode(errors="replace")
        self.version = self._dll.diopi_impl_version().decode(errors="replace")
        self.functions: dict[str, Any] = {}
        for op in OPS:
            fn = getattr(self._dll, op.symbol, None)
            if fn is None:
                continue
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.c_void_p] + [_ARG_TYPES[a.kind] for a in op.args]
            self.functions[op.aten] = fn
        self.allocator = abi.HostAllocator()
        self._context = ctypes.addressof(self.allocator.context)
        self._slots = abi.HandleSlots()
        self._plans: dict[Any, tuple[Any, OpSchema, tuple[str, ...]]] = {}

    def info(self) -> LibraryInfo:
        return LibraryInfo(
            self.path, self.vendor, self.version, self.abi_version,
            tuple(op.aten for op in OPS if op.aten in self.functions),
            tuple(op.aten for op in OPS if op.aten not in self.functions),
        )

    def implements(self, op: str) -> bool:
        return op in self.functions

    def address(self, op: str) -> int:
        """The address of the library's function for schema operator ``op`` (the C++ routes call it)."""
        return int(ctypes.cast(self.functions[op], ctypes.c_void_p).value or 0)

    def last_error(self) -> str:
        return self._dll.diopi_last_error().decode(errors="replace")

    def call(self, op: str | OpSchema, *args: Any) -> tuple[torch.Tensor, ...] | None:
        """Run ``op`` with arguments in ABI order: tensors (or None for optional ones), then scalars. For an
        output the kernel allocates (``out*``) pass the device to allocate it on (None: the CPU): the call
        returns those outputs, in order (otherwise None)."""
        plan = self._plans.get(op)
        if plan is None:
            plan = self._plan(op)
        fn, schema, kinds = plan
        if len(args) != len(kinds):
            raise TypeError(f"{schema.aten} takes {len(kinds)} arguments ({_signature(schema)}), got {len(args)}")
        slots = self._slots
        c_args: list[Any] = [self._context]
        holders: list[Any] | None = None
        n = 0
        for kind, value in zip(kinds, args):
            if kind is _TENSOR:
                if value is None:
                    raise TypeError(f"{schema.aten}: a required tensor is None ({_signature(schema)})")
                c_args.append(slots.fill(n, value))
                n += 1
            elif kind is _ALLOCATED:
                holder = ctypes.POINTER(abi.Tensor)()
                holders = [*(holders or ()), holder]
                self.allocator.expect(value)
                c_args.append(ctypes.addressof(holder))
            elif kind is _OPTIONAL_TENSOR:
                if value is None:
                    c_args.append(None)
                else:
                    c_args.append(slots.fill(n, value))
                    n += 1
            elif kind is _TENSOR_LIST or kind is _OPTIONAL_TENSOR_LIST:
                handles = []
                for tensor in value:
                    if tensor is None:
                        if kind is _TENSOR_LIST:
                            raise TypeError(f"{schema.aten}: a list entry is None ({_signature(schema)})")
                        handles.append(None)
                        continue
                    handles.append(slots.fill(n, tensor))
                    n += 1
                array = (ctypes.c_void_p * len(handles))(*handles)
                c_args.append(abi.TensorList(array, len(handles)))  # the array lives until the call returns
            elif kind is _INTS:
                c_args.append(abi.size_arg(value))
            else:
                c_args.append(value)
        if not holders:
            code = fn(*c_args)
            if self.allocator.pending:  # tensors the kernel required as scratch: the call is over
                self.allocator.done()
            if code:
                raise OperatorError(schema.aten, code, self.last_error())
            return None
        try:
            code = fn(*c_args)
            if code:
                raise OperatorError(schema.aten, code, self.last_error())
            made = tuple(self.allocator.take(h) for h in holders)
        finally:
            self.allocator.done()
        missing = [a.name for a, t in zip((a for a in schema.args if a.is_allocated), made) if t is None]
        if missing:
            raise OperatorError(schema.aten, abi.ERR_INVALID_ARGUMENT,
                                f"returned success without allocating {', '.join(missing)} through "
                                f"ctx->require_tensor")
        return made  # type: ignore[return-value]

    def _plan(self, op: str | OpSchema) -> tuple[Any, OpSchema, tuple[str, ...]]:
        schema = op if isinstance(op, OpSchema) else _schema(op)
        fn = self.functions.get(schema.aten)
        if fn is None:
            raise NotImplementedError(f"{self.vendor} does not implement {schema.aten}")
        kinds = tuple(_kind(a) for a in schema.args)
        plan = self._plans[op] = (fn, schema, kinds)
        return plan


def _kind(arg: Any) -> str:
    """How call() passes one ABI argument."""
    if arg.is_allocated:
        return _ALLOCATED
    if arg.is_tensor:
        return _TENSOR if arg.kind in ("out", "inout", "in") else _OPTIONAL_TENSOR
    if arg.is_tensor_list:
        return _OPTIONAL_TENSOR_LIST if arg.kind == "in?[]" else _TENSOR_LIST
    return _INTS if arg.kind == "ints" else _SCALAR


def _schema(name: str) -> OpSchema:
    from diopi_bindings.schema import BY_NAME

    schema = BY_NAME.get(name)
    if schema is None:
        raise KeyError(f"{name!r} is not a DIOPI operator; known: {', '.join(sorted(BY_NAME))}")
    return schema


def _signature(op: OpSchema) -> str:
    return ", ".join(f"{a.kind} {a.name}" for a in op.args)


def reference_library_path() -> Path:
    """The reference library built with the package (``make setup``)."""
    import diopi_bindings

    for root in list(getattr(diopi_bindings, "__path__", [])) + [str(Path(diopi_bindings.__file__).parent)]:
        candidate = Path(root) / "lib" / "libdiopi_reference.so"
        if candidate.is_file():
            return candidate
    import sysconfig

    candidate = Path(sysconfig.get_paths()["platlib"]) / "diopi_bindings" / "lib" / "libdiopi_reference.so"
    if candidate.is_file():
        return candidate
    raise LibraryError("the DIOPI reference library is not built: run `make setup`")


def _export_deeplink_runtime() -> bool:
    """Make the DeepLink DIOPI runtime (diopi_bindings._C_diopi, which needs torch) global; False without it."""
    try:
        import torch  # noqa: F401 (the extension links libtorch)

        from diopi_bindings import _C_diopi
    except ImportError:
        return False
    _C_diopi.export_runtime()
    return True


def load(path: str | os.PathLike | None = None) -> DiopiLibrary:
    """Load ``path``, else ``$DIOPI_LIBRARY``, else the reference library."""
    chosen = path or os.environ.get(LIBRARY_ENV) or reference_library_path()
    return DiopiLibrary(chosen)

