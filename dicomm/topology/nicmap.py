"""DICOMM_NIC_MAP: a user's fixed local-rank -> NIC assignment, validated against the node."""
from __future__ import annotations

import json

NIC_MAP_ENV = "DICOMM_NIC_MAP"
_EXAMPLE = "expected JSON like {\"0\": \"mlx5_0\", \"1\": \"mlx5_1\"} or 0:mlx5_0,1:mlx5_1"


class TopologyError(ValueError):
    """A topology setting (DICOMM_NIC_MAP) that does not fit this node."""


def parse_nic_map(text: str) -> dict[int, str]:
    """{local rank: NIC name}; TopologyError naming the bad entry when the text is malformed."""
    text = text.strip()
    if not text:
        return {}
    if text.startswith(("{", "[")):
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as e:
            raise TopologyError(f"{NIC_MAP_ENV} is not valid JSON ({e}); {_EXAMPLE}") from None
        if not isinstance(raw, dict):
            raise TopologyError(f"{NIC_MAP_ENV} must be a JSON object; {_EXAMPLE}")
        pairs = [(str(k), v) for k, v in raw.items()]
    else:
        pairs = []
        for entry in (e.strip() for e in text.split(",")):
            rank, sep, nic = entry.partition(":")
            if not sep or not entry:
                raise TopologyError(f"{NIC_MAP_ENV} entry {entry!r} is not rank:nic; {_EXAMPLE}")
            pairs.append((rank.strip(), nic.strip()))
    result: dict[int, str] = {}
    for rank, nic in pairs:
        if not rank.isdigit():
            raise TopologyError(f"{NIC_MAP_ENV}: local rank {rank!r} is not a non-negative "
                                f"integer; {_EXAMPLE}")
        if not isinstance(nic, str) or not nic:
            raise TopologyError(f"{NIC_MAP_ENV}: local rank {rank} maps to {nic!r}, expected a "
                                f"NIC name such as mlx5_0")
        if int(rank) in result:
            raise TopologyError(f"{NIC_MAP_ENV} names local rank {rank} twice")
        result[int(rank)] = nic
    return result


def validate_nic_map(nic_map: dict[int, str], nic_names: list[str], n_ranks: int | None,
                     sysfs_root: str) -> None:
    """TopologyError when the map names a NIC this node lacks or a rank it cannot have."""
    for rank, nic in sorted(nic_map.items()):
        if nic not in nic_names:
            found = ", ".join(nic_names) or "none"
            raise TopologyError(f"{NIC_MAP_ENV} maps local rank {rank} to {nic!r}, which is not an "
                                f"RDMA NIC on this node (found under "
                                f"{sysfs_root}/class/infiniband: {found}); "
                                f"fix or unset {NIC_MAP_ENV}")
        if n_ranks is not None and rank >= n_ranks:
            raise TopologyError(f"{NIC_MAP_ENV} names local rank {rank}, but this node has "
                                f"{n_ranks} accelerator ranks (local ranks 0-{n_ranks - 1}); "
                                f"fix or unset {NIC_MAP_ENV}")
