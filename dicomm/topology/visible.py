"""Which accelerator a local rank drives.

Local rank i drives the i-th accelerator in PCI bus order, unless the vendor's visible-devices list
is set: with several entries, local rank i drives entry i; with one entry (one device per process),
every local rank drives that entry. Entries are indices into that vendor's accelerators in PCI bus
order (for NVIDIA this is CUDA_DEVICE_ORDER=PCI_BUS_ID, the order clusters normally set).
Entries that are not indices (GPU UUIDs, MIG names) are not resolved: the list is then ignored and
the reason says so.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from dicomm.topology.model import Accelerator

VISIBLE_ENV: dict[str, tuple[str, ...]] = {
    "NVIDIA": ("CUDA_VISIBLE_DEVICES",),
    "AMD": ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"),
    "Hygon": ("HIP_VISIBLE_DEVICES",),
    "Huawei": ("ASCEND_RT_VISIBLE_DEVICES", "ASCEND_VISIBLE_DEVICES"),
    "Cambricon": ("MLU_VISIBLE_DEVICES",),
    "Moore Threads": ("MUSA_VISIBLE_DEVICES",),
    "Intel": ("ZE_AFFINITY_MASK",),
    "Habana": ("HABANA_VISIBLE_MODULES",),
}


@dataclass(frozen=True)
class RankMap:
    """accelerators[i] is local rank i's accelerator; how says where the order came from."""
    accelerators: tuple[Accelerator, ...]
    how: str
    one_per_process: bool = False

    def of(self, local_rank: int) -> Accelerator | None:
        if self.one_per_process:
            return self.accelerators[0]
        return self.accelerators[local_rank] if local_rank < len(self.accelerators) else None


def rank_map(accelerators: list[Accelerator], env: Mapping[str, str]) -> RankMap:
    all_in_order = RankMap(tuple(accelerators), "local rank i -> accelerator i in PCI bus order")
    for vendor in dict.fromkeys(a.vendor for a in accelerators):
        for var in VISIBLE_ENV.get(vendor, ()):
            value = env.get(var)
            if value is None or value.strip() == "":
                continue
            own = [a for a in accelerators if a.vendor == vendor]
            entries = [e.strip() for e in value.split(",") if e.strip()]
            if not all(e.isdigit() for e in entries):
                return RankMap(all_in_order.accelerators,
                               f"{var}={value} has entries that are not indices; ignored, "
                               f"{all_in_order.how}")
            bad = [e for e in entries if int(e) >= len(own)]
            if bad:
                return RankMap(all_in_order.accelerators,
                               f"{var}={value} names {vendor} device {bad[0]} but only {len(own)} "
                               f"found; ignored, {all_in_order.how}")
            picked = tuple(own[int(e)] for e in entries)
            return RankMap(picked, f"{var}={value}", one_per_process=len(picked) == 1)
    return all_in_order
