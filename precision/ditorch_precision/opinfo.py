"""Facts about an ATen op read once from its schema and cached: its names, which arguments it writes
(in-place and out= ops) and whether its output is a view. Tools use them to copy or check only what
an op can change."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils._pytree import tree_leaves

from .dump import tensors_in


@dataclass(frozen=True)
class OpInfo:
    op: str  # "aten::mm"
    overload: str  # "default"
    written: tuple[tuple[int, str], ...]  # (position, name) of every argument the op writes
    is_view: bool  # the output is a view of an input: no kernel computes it
    out_names: tuple[str, ...] = ()  # keyword-only written arguments (out=): only written, never read
    random: bool = False  # tagged nondeterministic_seeded: it draws random numbers
    # it has a CompositeImplicitAutograd kernel (and no CompositeExplicit one), which the autograd key
    # of a backend without a kernel of its own for it runs (decomposed_on): a dispatch mode sees its
    # parts there, not it, except where autograd does not run (inference mode)
    composite: bool = False
    autograd_only: bool = False  # autograd handles it whole: a dispatch mode sees it only without autograd
    backend_kernels: frozenset = frozenset()  # the backends (_BACKEND_KEYS) with a kernel of its own for it

    def decomposed_on(self, args, kwargs) -> bool:
        """Whether this call runs the composite kernel at its autograd key, as the C++ observer's
        composite_on: on its first tensor argument's backend; with none, or on a backend not listed
        (a sparse tensor), where no listed backend has a kernel."""
        if not self.composite:
            return False
        tensors = tensors_in((args, kwargs))
        key = _backend_key(tensors[0]) if tensors and tensors[0].layout == torch.strided else None
        return key not in self.backend_kernels if key is not None else not self.backend_kernels

    @property
    def mutates(self) -> bool:
        return bool(self.written)

    def written_tensors(self, args, kwargs) -> list[torch.Tensor]:
        """The tensors the op will write (a written list argument gives all its tensors)."""
        out: list[torch.Tensor] = []
        for pos, name in self.written:
            value = args[pos] if pos < len(args) else kwargs.get(name)
            if isinstance(value, torch.Tensor):
                out.append(value)
            elif isinstance(value, (list, tuple)):
                out.extend(t for t in tree_leaves(value) if isinstance(t, torch.Tensor))
        return out


_CACHE: dict = {}
# As the C++ observer's rule (precision/csrc/op_observer.cpp): a CompositeImplicitAutograd kernel
# serves a backend's autograd key where the op has no kernel for that backend nor a CompositeExplicit
# one; the ops autograd alone handles.
_BACKEND_KEYS = {"cpu": "CPU", "cuda": "CUDA", "xpu": "XPU", "mps": "MPS", "hpu": "HPU"}


def _backend_key(t: torch.Tensor) -> str | None:
    kind = t.device.type
    return "PrivateUse1" if kind == torch._C._get_privateuse1_backend_name() else _BACKEND_KEYS.get(kind)

_AUTOGRAD_ONLY = frozenset({"aten::detach_", "aten::set_data", "aten::data", "aten::_version", "aten::is_leaf",
                            "aten::output_nr", "aten::retain_grad", "aten::retains_grad", "aten::requires_grad_",
                            "aten::_backward"})
# Views in all but name: they reshape a fresh tensor that nothing else holds, and run no kernel.
_UNDECLARED_VIEWS = frozenset({"aten::_unsafe_view"})


def op_info(func) -> OpInfo:
    info = _CACHE.get(func)
    if info is None:
        schema = func._schema
        written = tuple((i, a.name) for i, a in enumerate(schema.arguments)
                        if a.alias_info is not None and a.alias_info.is_write)
        if not written and schema.name.startswith("c10d::") and schema.name.endswith("_") and schema.arguments:
            # in-place collectives (allreduce_, broadcast_, allgather_ ...) do not annotate that they
            # write their first argument
            written = ((0, schema.arguments[0].name),)
        is_view = bool(func.is_view) or schema.name in _UNDECLARED_VIEWS
        out_names = tuple(a.name for a in schema.arguments
                          if a.kwarg_only and a.alias_info is not None and a.alias_info.is_write)
        random = torch.Tag.nondeterministic_seeded in func.tags
        name = func.name()
        has = torch._C._dispatch_has_kernel_for_dispatch_key
        # (a CompositeExplicitAutogradNonFunctional kernel does not count: silu_backward has one)
        composite = has(name, "CompositeImplicitAutograd") and not has(name, "CompositeExplicitAutograd")
        backends = frozenset(k for k in (*_BACKEND_KEYS.values(), "PrivateUse1") if has(name, k))
        info = _CACHE[func] = OpInfo(schema.name, func._overloadname, written, is_view, out_names, random,
                                     composite, schema.name in _AUTOGRAD_ONLY, backends)
    return info
