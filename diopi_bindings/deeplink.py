"""Operator libraries written against DIOPI as DeepLink defines it (``include/deeplink/diopi``: opaque tensor
handles read through the runtime's diopiGetTensor* functions, ``diopiRequireTensor``/``diopiRequireBuffer``,
tagged scalars, DIOPI's dtype and error numbering, functions named ``diopiAdd``, ``diopiAddmm``, ...).

``attach(path)`` loads such a library on the native diopi device (``device.enable(..., backend="native")``
first: it provides the device memory), refuses one built for another DIOPI major version, and routes to it, in
C++, every ATen overload of ``diopi_functions.yaml`` whose DIOPI function it exports. The device's own router
keeps serving every other operator.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

INCLUDE_DIR = Path(__file__).resolve().parent / "include" / "deeplink"


class DiopiLoadError(RuntimeError):
    """A library that cannot be attached: missing, not a DIOPI library, another DIOPI version."""


def attach(path: str | Path) -> dict[str, Any]:
    """Load the library at ``path`` and route to it; returns its version, vendor, impl_version and the ATen
    overloads now routed. Once per process."""
    from diopi_bindings import device

    if device.backend() != "native":
        raise DiopiLoadError("attach a DIOPI library on the native diopi device: call "
                             "diopi_bindings.device.enable(LIBRARY, backend='native') first")
    file = Path(path)
    if not file.is_file():
        raise DiopiLoadError(f"{file}: no such file (expected a shared library built against "
                             f"{INCLUDE_DIR}/diopi/functions.h)")
    from diopi_bindings import _C_diopi
    from diopi_bindings.device.native import drop_library_ops, leave_composites_to_aten, routed_in_cpp

    drop_library_ops()  # the own-ABI library's kernels come back below, without the overloads routed in C++
    try:
        info = dict(_C_diopi.attach(str(file)))
    except RuntimeError as exc:
        routed_in_cpp([])
        raise DiopiLoadError(str(exc).splitlines()[0]) from None
    routed_in_cpp(list(info["routed"]))

    info["composites_to_aten"] = leave_composites_to_aten(list(info["routed"]))
    return info


def reference_path() -> Path:
    """The reference library under DIOPI's names (``libdiopi_reference_deeplink.so``, built with the package)."""
    from diopi_bindings.library import reference_library_path

    return reference_library_path().with_name("libdiopi_reference_deeplink.so")


def route_table() -> list[tuple[str, str]]:
    """Every (ATen overload, DIOPI function) the generated table routes."""
    from diopi_bindings import _C_diopi

    return [tuple(row) for row in _C_diopi.route_table()]


def routed_ops() -> Counter:
    """ATen overload -> calls the attached library served."""
    from diopi_bindings import _C_diopi

    return Counter({aten: n for aten, _, n, _ in _C_diopi.route_counts() if n})


def fallback_ops() -> Counter:
    """ATen overload -> calls the library declined (diopiNoImplement, diopiForceFallbackToCPU): run on the CPU."""
    from diopi_bindings import _C_diopi

    return Counter({aten: n for aten, _, _, n in _C_diopi.route_counts() if n})
