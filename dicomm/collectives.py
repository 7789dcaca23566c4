"""Collective methods of the dicomm process group, each mapped onto one engine collective.

torch's front-end calls the new method names (all_gather_single, reduce_scatter_single,
all_to_all_single); some C++ paths (functional collectives, DDP) reach Python only through the old
ones (_allgather_base, _reduce_scatter_base, alltoall_base, *_tensor_coalesced). Both are served.
Every rank must call collectives in the same order; the engine checks that the ranks' operations,
dtypes and sizes agree and fails with a MismatchError otherwise.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

from dicomm._types import dtype_name, reduce_op
from dicomm.staging import Stager
from dicomm.work import DicommWork


def _one(tensors: Sequence[torch.Tensor], what: str) -> torch.Tensor:
    if len(tensors) != 1:
        raise ValueError(f"dicomm {what}: expected exactly one tensor, got {len(tensors)}")
    return tensors[0]


def _same_shape(t: torch.Tensor, ref: torch.Tensor, what: str, role: str) -> None:
    if t.dtype != ref.dtype or t.numel() != ref.numel():
        raise ValueError(f"dicomm {what}: {role} has {t.numel()} x {t.dtype}, expected "
                         f"{ref.numel()} x {ref.dtype} like the input")


def _premultiplied(t: torch.Tensor, factor: Any) -> torch.Tensor:
    if isinstance(factor, torch.Tensor):
        factor = factor.item()
    return t * factor


class CollectivesMixin:
    """Collectives for DicommProcessGroup (which provides _comm, _r, _n)."""

    _comm: Any
    _r: int
    _n: int

    # -- helpers ------------------------------------------------------------------------------
    def _engine(self, name: str) -> Callable[..., Any]:
        fn = getattr(self._comm, name, None)
        if fn is None:
            raise NotImplementedError(f"dicomm: this engine build has no {name} collective")
        return fn

    def _check_root(self, root: int, what: str) -> None:
        if not 0 <= root < self._n:
            raise ValueError(f"dicomm {what}: invalid root rank {root}; the group has ranks "
                             f"0..{self._n - 1}")

    @staticmethod
    def _work(requests: list[Any], result: list[torch.Tensor], stager: Stager,
              keep: Any) -> DicommWork:
        return DicommWork(requests, result, finish=stager.finish if stager.needs_finish else None,
                          keep=keep)

    # -- broadcast / reduce -------------------------------------------------------------------
    def broadcast(self, tensors: list[torch.Tensor], opts: dist.BroadcastOptions) -> DicommWork:
        t = _one(tensors, "broadcast")
        root = opts.rootRank
        self._check_root(root, "broadcast")
        st = Stager()
        buf = st.input(t) if root == self._r else st.output(t)
        st.ready()
        req = self._engine("broadcast")(buf.data_ptr(), buf.nbytes, root)
        return self._work([req], tensors, st, buf)

    def _reduce_into(self, t: torch.Tensor, op: Any, what: str, root: int | None,
                     st: Stager) -> tuple[Any, torch.Tensor]:
        name, factor = reduce_op(op, t.dtype, what)
        dtype = dtype_name(t.dtype, what)
        buf = st.output(t, inout=True)
        st.ready()
        if factor is not None:
            buf.mul_(factor.item() if isinstance(factor, torch.Tensor) else factor)
        if root is None:
            return self._engine("all_reduce")(buf.data_ptr(), buf.numel(), dtype, name), buf
        return self._engine("reduce")(buf.data_ptr(), buf.numel(), dtype, name, root), buf

    def allreduce(self, tensors: list[torch.Tensor],
                  opts: dist.AllreduceOptions = dist.AllreduceOptions()) -> DicommWork:
        st = Stager()
        req, buf = self._reduce_into(_one(tensors, "all_reduce"), opts.reduceOp, "all_reduce",
                                     None, st)
        return self._work([req], tensors, st, buf)

    def allreduce_coalesced(self, tensors: list[torch.Tensor],
                            opts: Any = None) -> DicommWork:
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        st = Stager()
        pairs = [self._reduce_into(t, op, "all_reduce_coalesced", None, st) for t in tensors]
        return self._work([r for r, _ in pairs], tensors, st, [b for _, b in pairs])

    def reduce(self, tensors: list[torch.Tensor], opts: dist.ReduceOptions) -> DicommWork:
        root = opts.rootRank
        self._check_root(root, "reduce")
        st = Stager()
        req, buf = self._reduce_into(_one(tensors, "reduce"), opts.reduceOp, "reduce", root, st)
        return self._work([req], tensors, st, buf)

    # -- gather family ------------------------------------------------------------------------
    def _all_gather_ptrs(self, out_ptrs: list[int], send: torch.Tensor) -> Any:
        return self._engine("all_gather")(send.data_ptr(), send.nbytes, out_ptrs)

    def allgather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
                  opts: Any = None) -> DicommWork:
        outs = _one(output_tensors, "all_gather")
        t = _one(input_tensors, "all_gather")
        req, keep, st = self._allgather_list(outs, t, "all_gather")
        return self._work([req], outs, st, keep)

    def _allgather_list(self, outs: list[torch.Tensor], t: torch.Tensor, what: str):
        if len(outs) != self._n:
            raise ValueError(f"dicomm {what}: output list has {len(outs)} tensors, expected one "
                             f"per rank ({self._n})")
        for o in outs:
            _same_shape(o, t, what, "an output tensor")
        st = Stager()
        send = st.input(t)
        bufs = [st.output(o) for o in outs]
        st.ready()
        req = self._all_gather_ptrs([b.data_ptr() for b in bufs], send)
        return req, (send, bufs), st

    def allgather_coalesced(self, output_lists: list[list[torch.Tensor]],
                            input_list: list[torch.Tensor], opts: Any = None) -> DicommWork:
        parts = [self._allgather_list(outs, t, "all_gather_coalesced")
                 for outs, t in zip(output_lists, input_list, strict=True)]
        return _joined(parts, output_lists)

    def _gather_into(self, output: torch.Tensor, t: torch.Tensor, what: str):
        if output.dtype != t.dtype or output.numel() != t.numel() * self._n:
            raise ValueError(f"dicomm {what}: output has {output.numel()} x {output.dtype}, "
                             f"expected {t.numel() * self._n} x {t.dtype} (input x group size)")
        st = Stager()
        send = st.input(t)
        buf = st.output(output)
        st.ready()
        base, step = buf.data_ptr(), send.nbytes
        req = self._all_gather_ptrs([base + i * step for i in range(self._n)], send)
        return req, (send, buf), st

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor,
                          opts: Any = None) -> DicommWork:
        req, keep, st = self._gather_into(output, input, "all_gather_into_tensor")
        return self._work([req], [output], st, keep)

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs: list[torch.Tensor],
                                    inputs: list[torch.Tensor], opts: Any = None) -> DicommWork:
        parts = [self._gather_into(o, t, "all_gather_into_tensor_coalesced")
                 for o, t in zip(outputs, inputs, strict=True)]
        return _joined(parts, outputs)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def _root_list(self, lists: list[list[torch.Tensor]], like: torch.Tensor, root: int, what: str,
                   role: str) -> list[torch.Tensor]:
        """The root's per-rank tensor list of gather/scatter, checked; [] on the other ranks."""
        if self._r != root:
            if lists and lists[0]:
                raise ValueError(f"dicomm {what}: only the root rank passes {role} tensors")
            return []
        tensors = _one(lists, what)
        if len(tensors) != self._n:
            raise ValueError(f"dicomm {what}: root's {role} list has {len(tensors)} tensors, expected {self._n}")
        for x in tensors:
            _same_shape(x, like, what, f"an {role} tensor")
        return tensors

    def gather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
               opts: dist.GatherOptions) -> DicommWork:
        t = _one(input_tensors, "gather")
        root = opts.rootRank
        self._check_root(root, "gather")
        st = Stager()
        send = st.input(t)
        bufs = [st.output(o) for o in self._root_list(output_tensors, t, root, "gather", "output")]
        st.ready()
        req = self._engine("gather")(send.data_ptr(), send.nbytes, [b.data_ptr() for b in bufs],
                                     root)
        return self._work([req], output_tensors[0] if output_tensors else [], st, (send, bufs))

    def scatter(self, output_tensors: list[torch.Tensor],
                input_tensors: list[list[torch.Tensor]], opts: dist.ScatterOptions) -> DicommWork:
        t = _one(output_tensors, "scatter")
        root = opts.rootRank
        self._check_root(root, "scatter")
        st = Stager()
        sends = [st.input(i) for i in self._root_list(input_tensors, t, root, "scatter", "input")]
        buf = st.output(t)
        st.ready()
        req = self._engine("scatter")([s.data_ptr() for s in sends], buf.data_ptr(), buf.nbytes,
                                      root)
        return self._work([req], output_tensors, st, (sends, buf))

    # -- reduce_scatter -----------------------------------------------------------------------
    def _reduce_scatter_ptrs(self, sends: list[torch.Tensor], out: torch.Tensor, op: Any,
                             what: str, st: Stager):
        name, factor = reduce_op(op, out.dtype, what)
        if factor is not None:
            sends = [_premultiplied(s, factor) for s in sends]
        buf = st.output(out)
        st.ready()
        req = self._engine("reduce_scatter")([s.data_ptr() for s in sends], buf.data_ptr(),
                                             buf.numel(), dtype_name(out.dtype, what), name)
        return req, (sends, buf), st

    def reduce_scatter(self, output_tensors: list[torch.Tensor],
                       input_tensors: list[list[torch.Tensor]],
                       opts: dist.ReduceScatterOptions) -> DicommWork:
        out = _one(output_tensors, "reduce_scatter")
        ins = _one(input_tensors, "reduce_scatter")
        if len(ins) != self._n:
            raise ValueError(f"dicomm reduce_scatter: input list has {len(ins)} tensors, "
                             f"expected one per rank ({self._n})")
        for i in ins:
            _same_shape(i, out, "reduce_scatter", "an input tensor")
        st = Stager()
        req, keep, st = self._reduce_scatter_ptrs([st.input(i) for i in ins], out, opts.reduceOp,
                                                  "reduce_scatter", st)
        return self._work([req], output_tensors, st, keep)

    def _reduce_scatter_flat(self, out: torch.Tensor, inp: torch.Tensor, op: Any, what: str):
        if inp.dtype != out.dtype or inp.numel() != out.numel() * self._n:
            raise ValueError(f"dicomm {what}: input has {inp.numel()} x {inp.dtype}, expected "
                             f"{out.numel() * self._n} x {out.dtype} (output x group size)")
        st = Stager()
        chunks = list(st.input(inp).reshape(-1).chunk(self._n)) if out.numel() else \
            [torch.empty(0, dtype=inp.dtype)] * self._n
        return self._reduce_scatter_ptrs(chunks, out, op, what, st)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor,
                              opts: dist.ReduceScatterOptions) -> DicommWork:
        req, keep, st = self._reduce_scatter_flat(output, input, opts.reduceOp,
                                                  "reduce_scatter_tensor")
        return self._work([req], [output], st, keep)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor],
                                        inputs: list[torch.Tensor],
                                        opts: dist.ReduceScatterOptions) -> DicommWork:
        parts = [self._reduce_scatter_flat(o, i, opts.reduceOp, "reduce_scatter_coalesced")
                 for o, i in zip(outputs, inputs, strict=True)]
        return _joined(parts, outputs)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # -- all_to_all ---------------------------------------------------------------------------
    def _splits(self, t: torch.Tensor, splits: list[int], role: str) -> list[int]:
        """Byte offsets and sizes of each rank's slice of t along dim 0."""
        rows = t.shape[0] if t.dim() else 1
        if not splits:
            if rows % self._n:
                raise ValueError(f"dicomm all_to_all_single: {role} has {rows} rows, not "
                                 f"divisible by the group size {self._n}; pass split sizes")
            splits = [rows // self._n] * self._n
        if len(splits) != self._n or sum(splits) != rows or min(splits) < 0:
            raise ValueError(f"dicomm all_to_all_single: {role} split sizes {list(splits)} must "
                             f"be {self._n} non-negative numbers summing to {rows}")
        row_bytes = t.nbytes // rows if rows else 0
        return [s * row_bytes for s in splits]

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor,
                          output_split_sizes: list[int], input_split_sizes: list[int],
                          opts: Any = None) -> DicommWork:
        if output.dtype != input.dtype:
            raise ValueError(f"dicomm all_to_all_single: output dtype {output.dtype} differs "
                             f"from input dtype {input.dtype}")
        send_nbytes = self._splits(input, input_split_sizes, "input")
        recv_nbytes = self._splits(output, output_split_sizes, "output")
        st = Stager()
        send = st.input(input)
        buf = st.output(output)
        st.ready()
        req = self._engine("all_to_all")(_offsets(send.data_ptr(), send_nbytes), send_nbytes,
                                         _offsets(buf.data_ptr(), recv_nbytes), recv_nbytes)
        return self._work([req], [output], st, (send, buf))

    alltoall_base = all_to_all_single

    def alltoall(self, output_tensors: list[torch.Tensor], input_tensors: list[torch.Tensor],
                 opts: Any = None) -> DicommWork:
        if len(output_tensors) != self._n or len(input_tensors) != self._n:
            raise ValueError(f"dicomm all_to_all: expected {self._n} input and output tensors, "
                             f"got {len(input_tensors)} and {len(output_tensors)}")
        st = Stager()
        sends = [st.input(t) for t in input_tensors]
        bufs = [st.output(t) for t in output_tensors]
        st.ready()
        req = self._engine("all_to_all")([s.data_ptr() for s in sends], [s.nbytes for s in sends],
                                         [b.data_ptr() for b in bufs], [b.nbytes for b in bufs])
        return self._work([req], output_tensors, st, (sends, bufs))

    # -- barrier ------------------------------------------------------------------------------
    def barrier(self, opts: Any = None) -> DicommWork:
        return DicommWork([self._engine("barrier")()], [])


def _offsets(base: int, sizes: list[int]) -> list[int]:
    out, at = [], base
    for s in sizes:
        out.append(at)
        at += s
    return out


def _joined(parts: list[tuple[Any, Any, Stager]], result: list[Any]) -> DicommWork:
    """One Work over several engine requests (the coalesced variants)."""
    stagers = [st for _, _, st in parts if st.needs_finish]

    def finish() -> None:
        for st in stagers:
            st.finish()

    return DicommWork([req for req, _, _ in parts], result, finish=finish if stagers else None,
                      keep=[keep for _, keep, _ in parts])
