"""What the benchmark measures, one per label: a torch.distributed group or a raw communicator.

Every backend gets its own group, created in the same processes, so that all of them are measured
side by side in one run. A dicomm group (torch or raw API) is created with `DICOMM_TRANSPORT` set to
its transport and connected to every peer before the variable is restored: that is how the
"dicomm-tcp" group forces TCP while the "dicomm" group of the same processes chooses by itself.
"""
from __future__ import annotations

import contextlib
import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

_P2P_TAG = 7


@dataclass(frozen=True)
class BackendSpec:
    label: str      # "gloo", "dicomm", "dicomm-tcp", "dicomm-raw", ...
    backend: str    # "gloo" | "dicomm" | "memcpy" (the local copy that bounds a transfer)
    api: str        # "torch" | "raw" | "native" (raw, ping-pong looped in C++) | "local"
    transport: str  # requested transport: "auto" | "shm" | "tcp" | "verbs" (gloo: "tcp"; memcpy: "local")


def make_specs(backends: list[str], apis: list[str], transport: str, extra_tcp: bool,
               ) -> list[BackendSpec]:
    """The measured labels, in interleaving order."""
    specs: list[BackendSpec] = []
    for b in backends:
        if b == "gloo":
            specs.append(BackendSpec("gloo", "gloo", "torch", "tcp"))
            continue
        suffix = "" if transport == "auto" else f"-{transport}"
        for api in apis:
            label = "dicomm" + ("" if api == "torch" else f"-{api}") + suffix
            specs.append(BackendSpec(label, "dicomm", api, transport))
        if extra_tcp and transport != "tcp" and "torch" in apis:
            specs.append(BackendSpec("dicomm-tcp", "dicomm", "torch", "tcp"))
    return specs

MEMCPY = BackendSpec("memcpy", "memcpy", "local", "local")


def dicomm_status() -> str:
    """'' when the dicomm backend can be used here, otherwise why not."""
    try:
        import dicomm.backend  # noqa: F401  (registers the backend)
        from dicomm import _C
    except Exception as exc:  # any failure means: not usable yet
        return f"{type(exc).__name__}: {exc}"
    if not hasattr(_C, "Communicator"):
        return "dicomm._C has no Communicator (engine not built yet)"
    return ""


@contextlib.contextmanager
def _transport_env(transport: str):
    old = os.environ.get("DICOMM_TRANSPORT")
    os.environ["DICOMM_TRANSPORT"] = transport
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("DICOMM_TRANSPORT", None)
        else:
            os.environ["DICOMM_TRANSPORT"] = old


class TorchEndpoint:
    """A torch.distributed group holding every rank (group ranks equal global ranks)."""

    def __init__(self, spec: BackendSpec, group):
        self.spec, self.group = spec, group

    def send(self, t: torch.Tensor, peer: int) -> None:
        dist.send(t, peer, group=self.group, tag=_P2P_TAG)

    def recv(self, t: torch.Tensor, peer: int) -> None:
        dist.recv(t, peer, group=self.group, tag=_P2P_TAG)

    def isend(self, t, peer):
        return dist.isend(t, peer, group=self.group, tag=_P2P_TAG)

    def irecv(self, t, peer):
        return dist.irecv(t, peer, group=self.group, tag=_P2P_TAG)

    def transport_of(self, peer: int) -> str:
        """The transport the group uses to `peer` when it says (dicomm does), else ''."""
        try:
            comm = self.group.communicator  # dicomm: a property holding the engine communicator
            comm = comm if hasattr(comm, "transport_of") else comm()
            return str(comm.transport_of(peer))
        except Exception:
            return ""


class RawEndpoint:
    """dicomm's own Communicator on raw pointers, without torch.distributed in the path."""

    def __init__(self, spec: BackendSpec, comm):
        self.spec, self.comm = spec, comm

    @staticmethod
    def _nbytes(t: torch.Tensor) -> int:
        return t.numel() * t.element_size()

    def isend(self, t, peer):
        return self.comm.isend(t.data_ptr(), self._nbytes(t), peer, _P2P_TAG)

    def irecv(self, t, peer):
        return self.comm.irecv(t.data_ptr(), self._nbytes(t), peer, _P2P_TAG)

    def send(self, t: torch.Tensor, peer: int) -> None:
        self.isend(t, peer).wait()

    def recv(self, t: torch.Tensor, peer: int) -> None:
        self.irecv(t, peer).wait()

    def transport_of(self, peer: int) -> str:
        try:
            return str(self.comm.transport_of(peer))
        except Exception:
            return ""


def _connect_all(ep, rank: int, world_size: int) -> None:
    """One small message to and from every peer, so lazy connections are made now."""
    peers = [p for p in range(world_size) if p != rank]
    out = torch.zeros(8, dtype=torch.uint8)
    ins = [torch.zeros(8, dtype=torch.uint8) for _ in peers]
    reqs = [ep.irecv(b, p) for b, p in zip(ins, peers)] + [ep.isend(out, p) for p in peers]
    for r in reqs:
        r.wait()


class MemcpyEndpoint:
    """Not a transport: rank 0 copies the buffer locally, the ceiling of a single-copy transfer."""

    def __init__(self, spec: BackendSpec):
        self.spec = spec

    def transport_of(self, peer: int) -> str:
        return "local"


def make_endpoint(spec: BackendSpec, store, rank: int, world_size: int, timeout_s: float):
    """Creates the group or communicator of `spec` (a collective call: every rank makes it)."""
    timeout = datetime.timedelta(seconds=timeout_s)
    if spec.backend == "memcpy":
        return MemcpyEndpoint(spec)
    if spec.backend == "gloo":
        ep = TorchEndpoint(spec, dist.new_group(backend="gloo", timeout=timeout))
        _connect_all(ep, rank, world_size)
        return ep
    import dicomm.backend  # noqa: F401  (registers the backend)

    with _transport_env(spec.transport):
        if spec.api in ("raw", "native"):
            from dicomm import _C

            comm = _C.Communicator(dist.PrefixStore(f"bench/{spec.label}", store), rank,
                                   world_size, timeout_s=timeout_s, transport=spec.transport)
            ep = RawEndpoint(spec, comm)
        else:
            ep = TorchEndpoint(spec, dist.new_group(backend="dicomm", timeout=timeout))
        _connect_all(ep, rank, world_size)
    return ep


def close_endpoint(ep) -> None:
    if isinstance(ep, RawEndpoint):
        with contextlib.suppress(Exception):
            ep.comm.close()
