"""The torch.distributed backend `dicomm`.

The backend is a C++ `c10d::Backend` (module `dicomm._C_torch`), registered for the CPU and CUDA
devices the way gloo's is: torch builds a normal ProcessGroup with one backend per device, so
mixed strings such as "cpu:gloo,cuda:dicomm" keep the other backend and `pg._get_backend(device)`
works. This file only registers it and picks the network card.
"""
from __future__ import annotations

import logging
import os
from typing import Any

import torch
import torch.distributed as dist

import dicomm._C_torch as _C_torch
from dicomm import errors  # noqa: F401  (the classes the backend raises)

log = logging.getLogger("dicomm")

BACKEND_NAME = "dicomm"
DicommBackend = _C_torch.DicommBackend


def _choose_nic(rank: int, settings: dict[str, str]) -> None:
    """Once per process: logs this rank's NIC and hands it to the engine unless DICOMM_IB_HCA is set
    (in the environment, or as the group's setting, which the environment would override)."""
    global _nic_chosen
    if _nic_chosen:
        return
    _nic_chosen = True
    from dicomm.topology import select_nic
    choice = select_nic(int(os.environ.get("LOCAL_RANK", rank)))
    log.info("dicomm rank %d: %s", rank, choice.describe())
    if choice.nic and not os.environ.get("DICOMM_IB_HCA") and "DICOMM_IB_HCA" not in settings:
        os.environ["DICOMM_IB_HCA"] = choice.nic


_nic_chosen = False


def _settings_of(pg_options: Any) -> dict[str, str]:
    """The group's settings from `pg_options` (None: none, the environment alone)."""
    if pg_options is None:
        return {}
    if not isinstance(pg_options, DicommBackend.Options):
        raise TypeError("pg_options for the dicomm backend must be dicomm.backend.DicommBackend.Options"
                        f"(settings={{...}}), got {type(pg_options).__name__}")
    return dict(pg_options.settings)


def _create(opts: Any, pg_options: Any = None) -> DicommBackend:
    """torch's creator hook (extended API): one backend, and one engine communicator, per group,
    configured with the settings of `pg_options` (init_process_group's or new_group's)."""
    settings = _settings_of(pg_options)
    _choose_nic(opts.group_rank, settings)
    backend = _C_torch.create_backend(opts.store, opts.group_rank, opts.group_size,
                                      opts.timeout.total_seconds(), settings)
    log.debug("dicomm group %r: rank %d of %d", opts.group_id, opts.group_rank, opts.group_size)
    return backend


def communicator_of(group: dist.ProcessGroup) -> DicommBackend | None:
    """The dicomm backend serving `group`'s CPU tensors (transport_of, stats), or None."""
    try:
        backend = group._get_backend(torch.device("cpu"))
    except RuntimeError:
        return None
    return backend if isinstance(backend, DicommBackend) else None


def register() -> None:
    """Registers the backend with torch.distributed (idempotent)."""
    if "DICOMM" in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True,
                                  devices=["cpu", "cuda"])


register()
# `group.communicator`, as the benchmark and older callers read it: an added read-only property.
if not hasattr(dist.ProcessGroup, "communicator"):
    dist.ProcessGroup.communicator = property(communicator_of)  # type: ignore[attr-defined]  # added here
