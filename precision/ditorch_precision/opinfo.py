"""Facts about an ATen op read once from its schema and cached: its names, which arguments it writes
(in-place and out= ops) and whether its output is a view. Tools use them to copy or check only what
an op can change."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils._pytree import tree_leaves


@dataclass(frozen=True)
class OpInfo:
    op: str  # "aten::mm"
    overload: str  # "default"
    written: tuple[tuple[int, str], ...]  # (position, name) of every argument the op writes
    is_view: bool  # the output is a view of an input: no kernel computes it
    out_names: tuple[str, ...] = ()  # keyword-only written arguments (out=): only written, never read
    random: bool = False  # tagged nondeterministic_seeded: it draws random numbers
    # autograd's keys run its CompositeImplicitAutograd decomposition: a dispatch mode sees its parts,
    # not it, except where autograd does not run (inference mode)
    composite: bool = False
    autograd_only: bool = False  # autograd handles it whole: a dispatch mode sees it only without autograd

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
# serves the autograd keys only where none of these has a kernel; the ops autograd alone handles.
_BACKEND_KERNEL_KEYS = ("CPU", "CUDA", "XPU", "MPS", "HPU", "PrivateUse1", "CompositeExplicitAutograd",
                        "CompositeExplicitAutogradNonFunctional")
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
        composite = has(name, "CompositeImplicitAutograd") and not any(has(name, k) for k in _BACKEND_KERNEL_KEYS)
        info = _CACHE[func] = OpInfo(schema.name, func._overloadname, written, is_view, out_names, random,
                                     composite, schema.name in _AUTOGRAD_ONLY)
    return info
