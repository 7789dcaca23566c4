"""The torch.distributed backend `dicomm`: a ProcessGroup whose traffic runs on the dicomm engine.

torch accepts a Python `ProcessGroup` subclass from a backend's creator and uses it as the group
itself. This file holds the group's plumbing (creation, names, shutdown) and point-to-point; the
collectives live in `dicomm.collectives`.
"""
from __future__ import annotations

import datetime
import logging
import os
from typing import Any

import torch
import torch.distributed as dist

from dicomm import _C
from dicomm.collectives import CollectivesMixin
from dicomm.staging import Stager
from dicomm.work import DicommWork, _orphans, sweep_orphans

log = logging.getLogger("dicomm")

BACKEND_NAME = "dicomm"
_MAX_TAG = (1 << 63) - 1  # the engine keeps the upper half of its tag space for collectives
_ANY_SOURCE = -1


class DicommProcessGroup(CollectivesMixin, dist.ProcessGroup):
    """A process group of `size` ranks served by one dicomm engine communicator."""

    def __init__(self, store: dist.Store, rank: int, size: int,
                 timeout: datetime.timedelta = datetime.timedelta(minutes=30),
                 global_ranks: list[int] | None = None, group_name: str = "") -> None:
        super().__init__(rank, size)
        self._r = rank
        self._n = size
        self._timeout_s = timeout.total_seconds()
        self._global_ranks = list(global_ranks) if global_ranks else list(range(size))
        self._group_name = group_name
        self._group_desc = ""
        self._store = store  # the engine reads peers' address cards from it
        _choose_nic(rank)
        self._comm = _C.Communicator(store, rank, size, self._timeout_s, "auto")
        log.debug("dicomm group %r: rank %d of %d, timeout %.0f s",
                  group_name, rank, size, self._timeout_s)

    # -- identity -----------------------------------------------------------------------------
    def getBackendName(self) -> str:
        return BACKEND_NAME

    def getGroupName(self) -> str:
        return self._group_name

    def setGroupName(self, name: str) -> None:
        self._group_name = name

    def getGroupDesc(self) -> str:
        return self._group_desc

    def setGroupDesc(self, desc: str) -> None:
        self._group_desc = desc

    def get_group_store(self) -> dist.Store:
        return self._store

    @property
    def communicator(self) -> Any:
        """The engine communicator (transport per peer, statistics)."""
        return self._comm

    # -- lifecycle ----------------------------------------------------------------------------
    def abort(self) -> None:
        self._comm.abort("process group aborted")

    def shutdown(self) -> None:
        self._comm.close()

    # -- point-to-point -----------------------------------------------------------------------
    def send(self, tensors: list[torch.Tensor], dstRank: int, tag: int) -> DicommWork:
        if len(tensors) == 1 and 0 <= dstRank < self._n and 0 <= tag <= _MAX_TAG and not _orphans:
            t = tensors[0]
            if t.is_cpu and t.is_contiguous():  # the common path: no staging, no checks left
                return DicommWork((self._comm.isend(t.data_ptr(), t.nbytes, dstRank, tag),),
                                  tensors, keep=t)
        return self._send_checked(tensors, dstRank, tag)

    def _send_checked(self, tensors: list[torch.Tensor], dst: int, tag: int) -> DicommWork:
        self._check_p2p(tensors, dst, tag, "send")
        if _orphans:
            sweep_orphans()
        stager = Stager()
        host = stager.input(tensors[0])
        stager.ready()
        return DicommWork((self._comm.isend(host.data_ptr(), host.nbytes, dst, tag),), tensors,
                          keep=host)

    def _check_p2p(self, tensors: list[torch.Tensor], peer: int, tag: int, op: str) -> None:
        if len(tensors) != 1:
            raise ValueError(f"dicomm {op}: expected one tensor, got {len(tensors)}")
        if not (0 <= peer < self._n or (peer == _ANY_SOURCE and op == "recv_anysource")):
            raise ValueError(f"dicomm {op}: invalid peer rank {peer}; group "
                             f"{self._group_name!r} has ranks 0..{self._n - 1}")
        if not 0 <= tag <= _MAX_TAG:
            raise ValueError(f"dicomm {op}: tag {tag} outside 0..{_MAX_TAG}")

    def recv(self, tensors: list[torch.Tensor], srcRank: int, tag: int) -> DicommWork:
        if len(tensors) == 1 and 0 <= srcRank < self._n and 0 <= tag <= _MAX_TAG and not _orphans:
            t = tensors[0]
            if t.is_cpu and t.is_contiguous():
                n = t.nbytes
                return DicommWork((self._comm.irecv(t.data_ptr(), n, srcRank, tag),), tensors,
                                  keep=t, expect_nbytes=n)
        return self._recv_checked(tensors, srcRank, tag)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int) -> DicommWork:
        return self._recv_checked(tensors, _ANY_SOURCE, tag)

    def _recv_checked(self, tensors: list[torch.Tensor], src: int, tag: int) -> DicommWork:
        self._check_p2p(tensors, src, tag, "recv" if src != _ANY_SOURCE else "recv_anysource")
        if _orphans:
            sweep_orphans()
        stager = Stager()
        host = stager.output(tensors[0])
        return DicommWork((self._comm.irecv(host.data_ptr(), host.nbytes, src, tag),), tensors,
                          finish=stager.finish if stager.needs_finish else None, keep=host,
                          expect_nbytes=host.nbytes)

    def __repr__(self) -> str:
        return (f"DicommProcessGroup(name={self._group_name!r}, rank={self._r}, "
                f"size={self._n}, global_ranks={self._global_ranks})")


_nic_chosen = False


def _choose_nic(rank: int) -> None:
    """Once per process: logs this rank's NIC and hands it to the engine unless DICOMM_IB_HCA is set."""
    global _nic_chosen
    if _nic_chosen:
        return
    _nic_chosen = True
    from dicomm.topology import select_nic
    choice = select_nic(int(os.environ.get("LOCAL_RANK", rank)))
    log.info("dicomm rank %d: %s", rank, choice.describe())
    if choice.nic and not os.environ.get("DICOMM_IB_HCA"):
        os.environ["DICOMM_IB_HCA"] = choice.nic


def _create(opts: Any, pg_options: Any = None) -> DicommProcessGroup:
    """torch's creator hook (extended API): one communicator per group and member rank."""
    return DicommProcessGroup(opts.store, opts.group_rank, opts.group_size, opts.timeout,
                              global_ranks=list(opts.global_ranks_in_group),
                              group_name=str(opts.group_id))


def register() -> None:
    """Registers the backend with torch.distributed (idempotent)."""
    if "DICOMM" in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True,
                                  devices=["cpu", "cuda"])


register()
