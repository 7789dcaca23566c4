"""NicChoice: the NIC one local rank uses, and why."""
from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class NicChoice:
    """nic is None when the node has no RDMA NIC; path is None when the rank has no accelerator.

    affinity is True only for PIX/PXB paths (the NIC reaches the accelerator without crossing the
    CPU); whoever uses a choice with affinity False should say so once, quoting reason.
    """
    local_rank: int
    nic: str | None
    netdev: str | None
    path: str | None
    affinity: bool
    reason: str
    accelerator: str | None = None   # PCI address of the rank's accelerator
    overridden: bool = False         # set by DICOMM_NIC_MAP

    def describe(self) -> str:
        """One log line: 'local rank 0: mlx5_0 (eth0), PIX, affinity NIC: <reason>'."""
        if self.nic is None:
            return f"local rank {self.local_rank}: no RDMA NIC: {self.reason}"
        kind = "affinity NIC" if self.affinity else "non-affinity NIC"
        net = f" ({self.netdev})" if self.netdev else ""
        return (f"local rank {self.local_rank}: {self.nic}{net}, {self.path or 'path unknown'}, "
                f"{kind}: {self.reason}")

    def to_dict(self) -> dict[str, object]:
        return asdict(self)
