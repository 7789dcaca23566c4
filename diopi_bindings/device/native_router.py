"""The router of the native device (``_C_device``): which ATen overloads the own-ABI library serves, and how, resolved
once per overload by the same rules as the host-memory stand-in (router.py); the calls themselves run in C++.

The C++ extension serves allocation, views, ``resize_``/``set_`` and copies. Each ATen overload the library serves
(``serves``) gets a C++ kernel (csrc_diopi/own_router.cpp) made from its plan (``route_plan``): which schema operator,
in which form (functional, in place, out=), and each ABI argument from which ATen argument. Every other operator
reaches the boxed fallback in C++ (csrc_diopi/cpu_fallback.cpp). When the library declines a call (a dtype it lacks,
arguments its ABI cannot carry, an error code), the kernel logs it once per overload, counts it, and hands it to the
same C++ fallback, which runs it on the CPU. No Python runs per operator.
"""
from __future__ import annotations

from collections import Counter
from typing import Any

import torch

from diopi_bindings.device.router import (
    _MASK_INDEXED,
    _MASKED_SELECT,
    _METADATA_OPS,
    DEVICE_TYPE,
    INPLACE,
    OUT,
    SCALAR_DEFAULTS,
    Router,
    _is_view,
    _out_names,
    aten_name,
)
from diopi_bindings.library import DiopiLibrary
from diopi_bindings.schema import OPS

_ZERO, _FILL = torch.ops.aten.zero_.default, torch.ops.aten.fill_.Scalar
_NONZERO = torch.ops.aten.nonzero.default
_ATTENTION = "aten::_scaled_dot_product_flash_attention_for_cpu"


def is_native_tensor(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type == DEVICE_TYPE


class NativeRouter(Router):
    def __init__(self, library: DiopiLibrary, runtime: Any) -> None:
        super().__init__(library, lambda t: t, is_native_tensor)
        self.runtime = runtime  # diopi_bindings._C_device
        self._schema_index = {op.aten: i for i, op in enumerate(OPS)}

    def serves(self, func: torch._ops.OpOverload) -> bool:
        """Whether ``func`` is the library's to run (its kernel is a route); views and every operator the library
        lacks are the C++ fallback's."""
        if _is_view(func) or func._schema.name in _METADATA_OPS:
            return False
        if func is _ZERO:  # zero_ is fill_ with 0
            return self.resolve(_FILL)[0] is not None
        if func in _MASKED_SELECT:  # the mask's nonzero columns index the input
            return all(self.resolve(f)[0] is not None for f in (_NONZERO, torch.ops.aten.index.Tensor))
        return self.resolve(func)[0] is not None

    def route_plan(self, func: torch._ops.OpOverload) -> dict[str, Any]:
        """The plan of ``func``'s C++ kernel (own_router.h's OwnRoute), for an overload the library ``serves``."""
        names = [a.name for a in func._schema.arguments]

        def at(name: str) -> int:  # the ATen argument's position, -1 when the overload has none
            return names.index(name) if name in names else -1

        plan: dict[str, Any] = {"overload": aten_name(func), "counted_as": aten_name(func), "call": 0, "function": 0,
                                "form": "functional", "masked_select": func in _MASKED_SELECT, "args": [],
                                "targets": [], "mask_indices": -1, "mask_base": -1, "nonzero": False,
                                "dropout": -1, "attn_mask": -1}
        if plan["masked_select"]:
            return plan
        served = _FILL if func is _ZERO else func
        op, form = self.resolve(served)
        if op is None:
            raise ValueError(f"{aten_name(func)}: {self.library.vendor} does not serve it")
        args = []
        for arg in op.args:
            default, source = SCALAR_DEFAULTS.get((op.aten, arg.name), ("", ""))
            if func is _ZERO and arg.name == "value":
                default = "zero"
            args.append((arg.kind, at(arg.name), default, at(source) if source else -1))
        targets = _out_names(func) if form == OUT else ["self"] if form == INPLACE else []
        plan.update(counted_as=aten_name(served), call=self._schema_index[op.aten],
                    function=self.library.address(op.aten), form=form, args=args, targets=[at(n) for n in targets])
        if op.aten in _MASK_INDEXED:
            plan.update(mask_indices=at("indices"), mask_base=at("self"), nonzero=self.resolve(_NONZERO)[0] is not None)
        if op.aten.startswith(_ATTENTION):
            plan.update(dropout=at("dropout_p"), attn_mask=at("attn_mask"))
        return plan

    @property
    def routed(self) -> Counter[str]:
        """Calls the library served so far, per ATen overload (counted in C++)."""
        from diopi_bindings import _C_diopi

        return Counter({k: int(v) for k, v in _C_diopi.own_routed_counts().items()})

    def copy_counts(self) -> Counter[str]:
        """Every tensor copy of the device by direction (counted in C++: .to(), .cpu(), .item(), the CPU
        fallback's and the routes' own), and by reason: the C++ fallback's, and a CPU operand moved for a call."""
        from diopi_bindings import _C_diopi

        out = Counter({k: int(v) for k, v in self.runtime.copy_counts().items() if v})
        out.update({k: int(v) for k, v in _C_diopi.fallback_copies().items() if v})
        if moved := int(_C_diopi.own_operand_copies()):
            out["operand to device"] += moved
        return out

    def fallback_counts(self) -> Counter[str]:
        """Calls run on the CPU per ATen overload: the C++ fallback's (operators the library lacks) and the
        routes' (an operator of the library that declined these arguments)."""
        from diopi_bindings import _C_diopi

        out = Counter({k: int(v) for k, v in _C_diopi.fallback_counts().items()})
        out.update({k: int(v) for k, v in _C_diopi.own_fallback_counts().items()})
        return out
