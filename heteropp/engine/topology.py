"""Where a rank sits in the plan, which device and backend its chip type maps to, and its process groups.

Ranks are assigned stage by stage (Plan.rank_offsets): stage k, replica r, TP rank t -> offset_k + r*tp_k + t,
where r < dp * inner_dp_k counts the pipelines' and the stage's inner replicas together (r = outer replica
* inner_dp_k + inner replica). TP and DP groups live inside one stage and use the chip type's native
backend (through ditorch); DP gradients are therefore only ever reduced among chips of one type, over
each stage's own replicas.
"""
from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ..plan import Plan
from ..model.parallel import TPGroup


@dataclass(frozen=True)
class Coord:
    stage: int
    replica: int  # within the stage: outer * inner_dp + inner
    tp_rank: int
    inner_dp: int = 1  # the stage's inner replicas

    @property
    def outer(self) -> int:
        """The pipeline (outer data-parallel replica) this rank serves."""
        return self.replica // self.inner_dp

    @property
    def inner(self) -> int:
        """Which slice of every micro-batch's sequences this rank takes."""
        return self.replica % self.inner_dp


def coord_of(plan: Plan, rank: int) -> Coord:
    offs = plan.rank_offsets()
    for k, s in enumerate(plan.stages[:plan.devices]):
        if offs[k] <= rank < offs[k] + plan.stage_ranks(k):
            d, t = divmod(rank - offs[k], s.tp)
            return Coord(k, d, t, s.inner_dp)
    raise ValueError(f"rank {rank} is outside the plan's {plan.world_size} ranks")


def rank_of(plan: Plan, stage: int, replica: int, tp_rank: int) -> int:
    return plan.rank_offsets()[stage] + replica * plan.stages[stage].tp + tp_rank


def resolve_chip(chip: str, chip_map: dict[str, str]) -> Any:
    """The ditorch adapter for a plan's chip name: through the chip map, else the name itself."""
    import ditorch
    vendor = chip_map.get(chip, chip)
    try:
        return ditorch.adapter_for(vendor)
    except Exception as e:  # ditorch names the unknown vendor; add what to do about it
        raise ValueError(f"plan chip type {chip!r} maps to no ditorch adapter ({e}); pass --chip-map "
                         f"{chip}=<vendor> (e.g. {chip}=cpu) or give the chip a `device` in the cluster spec") from e


def stage_device(chip: str, chip_map: dict[str, str], stage: int) -> torch.device:
    """The device this rank's stage (of chip type `chip`) runs on, its vendor made usable in this process:
    detecting it registers a device torch does not know by itself (a DIOPI library's, or a plug-in's), which the
    host's own choice of vendor (`import ditorch`) may not have done. ValueError naming the stage, the vendor and
    why where it is not usable on this host."""
    adapter = resolve_chip(chip, chip_map)
    why = adapter.unavailable_reason()
    if why is not None:
        raise ValueError(f"stage {stage} (chip type {chip!r}) runs on vendor {adapter.name!r}, which is not usable "
                         f"on this host: {why}; run the stage on a host that has it, or map the chip type to one "
                         f"this host has (--chip-map, the cluster spec's `device`)")
    return torch.device(adapter.device_type)


@dataclass
class Groups:
    coord: Coord
    tp: TPGroup
    dp: Any  # process group of this rank's DP peers (same stage, same TP rank), None when the stage has one replica
    device: torch.device
    p2p_cpu: bool  # stage tensors must be staged through host memory for the point-to-point backend
    # tied embeddings on two stages: the ranks of the embedding's and the head's stages (None otherwise)
    tie: Any = None


def stage_groups(plan: Plan, rank: int, chip_map: dict[str, str], timeout_s: float) -> tuple[Any, Any]:
    """Creates the TP and DP groups of every stage of `plan`; returns this rank's (None where it has none,
    or holds no rank of `plan`: another replica group's, Plan.replicas)."""
    timeout = datetime.timedelta(seconds=timeout_s)
    mine_tp = mine_dp = None
    for k, s in enumerate(plan.stages[:plan.devices]):
        backend = resolve_chip(s.chip, chip_map).backend
        for d in range(plan.stage_dp(k)):
            ranks = [rank_of(plan, k, d, t) for t in range(s.tp)]
            g = dist.new_group(ranks, backend=backend, timeout=timeout) if s.tp > 1 else None
            if rank in ranks:
                mine_tp = g
        for t in range(s.tp):
            ranks = [rank_of(plan, k, d, t) for d in range(plan.stage_dp(k))]
            g = dist.new_group(ranks, backend=backend, timeout=timeout) if plan.stage_dp(k) > 1 else None
            if rank in ranks:
                mine_dp = g
    return mine_tp, mine_dp


def tie_ranks(plan: Plan) -> list[int]:
    """The ranks that sum a tied embedding's copies: every rank of the stage holding the embedding and of the one
    holding the head (where an interleaved schedule puts both on one device, its ranks once)."""
    ends = sorted({0, (len(plan.stages) - 1) % plan.devices})
    return [rank_of(plan, k, d, t) for k in ends for d in range(plan.stage_dp(k)) for t in range(plan.stages[k].tp)]


def build_groups(plan: Plan, rank: int, chip_map: dict[str, str], p2p_backend: str, timeout_s: float,
                 tied: bool = False) -> Groups:
    """Every rank creates every group, in the same order (torch requires it), and keeps its own. `tied`: the
    model's output head is its embedding; with more than one stage the two stages' ranks get a group (over the
    point-to-point backend, which spans chip types) to sum the two copies' gradients."""
    timeout = datetime.timedelta(seconds=timeout_s)
    me = coord_of(plan, rank)
    device = stage_device(plan.stages[me.stage].chip, chip_map, me.stage)
    mine_tp, mine_dp = stage_groups(plan, rank, chip_map, timeout_s)
    tie = None
    if tied and len(plan.stages) > 1:
        ranks = tie_ranks(plan)
        tg = dist.new_group(ranks, backend=p2p_backend, timeout=timeout)
        tie = tg if rank in ranks else None
    # Communicators are created eagerly: NCCL's first batched p2p must otherwise include every rank.
    for g in (mine_tp, mine_dp):
        if g is not None:
            dist.all_reduce(torch.zeros(1, device=device), group=g)
    return Groups(me, TPGroup(me.tp_rank, plan.stages[me.stage].tp, mine_tp), mine_dp, device,
                  p2p_cpu=staged(device, p2p_backend), tie=tie)


def staged(device: torch.device, p2p_backend: str) -> bool:
    """Whether stage tensors on `device` cross through host memory: gloo's are always (its device path is
    not used for point-to-point), others' where the backend serves no tensors of that device type (dicomm:
    cpu and cuda; a vendor's own device, as diopi or npu, is staged)."""
    if device.type == "cpu":
        return False
    return p2p_backend == "gloo" or device.type not in dist.Backend.backend_capability.get(p2p_backend, [])
