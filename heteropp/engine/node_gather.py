"""What every node of a torchrun launch is, told to all its workers before any process group forms: per
GROUP_RANK, the chip type its host says (HETEROPP_CHIP, None where unset) and its process count
(LOCAL_WORLD_SIZE). node_ranks.match_nodes reads it to know which entry of the run's node list each node is.

It travels over torchrun's rendezvous store (env://, the store the default group then uses): each node's
local rank 0 writes one key, every worker waits for all of them. The keys are not scoped by
TORCHELASTIC_RESTART_COUNT: the nodes of one round may disagree on it (an agent whose workers failed counts a
restart, one that restarted for the membership change does not), and each would wait for keys the others never
write. With TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 every round has a fresh store, so no key of an earlier round
is there; torch's default keeps the agent's store across rounds, so a restarted worker on it is refused
(torch's own gloo groups cannot form there either). What another node wrote is data: read and checked, never
trusted.
"""
from __future__ import annotations

import datetime
import json
from typing import Mapping

from torch._C._distributed_c10d import Store
from torch.distributed import DistStoreError
from torch.distributed.rendezvous import rendezvous

from ..spec.errors import SpecError
from .node_ranks import env_int

_PREFIX = "heteropp/nodes"


def gather_nodes(env: Mapping[str, str], rank: int, world: int, timeout: datetime.timedelta
                 ) -> tuple[Store, dict[int, tuple[str | None, int]]]:
    """torchrun's rendezvous store (env: torchrun's environment; rank and world: its RANK and WORLD_SIZE) and
    {GROUP_RANK: (chip type or None, process count)} for every node of the launch. SpecError naming the
    variable when the launcher is not torchrun."""
    node, nodes = env_int(env, "GROUP_RANK"), env_int(env, "GROUP_WORLD_SIZE")
    local, procs = env_int(env, "LOCAL_RANK"), env_int(env, "LOCAL_WORLD_SIZE")
    restarts = env.get("TORCHELASTIC_RESTART_COUNT", "0")
    if env.get("TORCHELASTIC_USE_AGENT_STORE") == "True" and restarts != "0":
        raise SpecError("torchrun", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE",
                        f"restart {restarts} on the agent's store, which still holds the earlier rounds' keys",
                        "1 in every agent's environment (a fresh store for every restart round)")
    store, _, _ = next(rendezvous("env://", rank=rank, world_size=world, timeout=timeout))
    if local == 0:
        store.set(f"{_PREFIX}/{node}", json.dumps([env.get("HETEROPP_CHIP"), procs]))
    keys = [f"{_PREFIX}/{g}" for g in range(nodes)]
    try:
        store.wait(keys, timeout)
    except DistStoreError:  # a node whose workers died (or hang) before saying what it is: name it
        missing = [g for g, k in enumerate(keys) if not store.check([k])]
        raise SpecError("torchrun", f"node {missing[0] if missing else '?'}",
                        f"wrote nothing to the rendezvous store within {timeout.total_seconds():g} s "
                        f"(nodes {missing} silent)", "every node's local rank 0 to say what it is") from None
    return store, {g: _read(g, store.get(k)) for g, k in enumerate(keys)}


def _read(node: int, raw: bytes) -> tuple[str | None, int]:
    """Node `node`'s entry as written by gather_nodes; SpecError naming the node when it is not."""
    try:
        chip, procs = json.loads(raw)
    except (ValueError, TypeError):
        chip = procs = None
    if (chip is not None and not isinstance(chip, str)) or not isinstance(procs, int) or isinstance(procs, bool) \
            or procs < 1:
        raise SpecError("torchrun", f"node {node}", f"told the store {raw[:80]!r}",
                        "[chip type or null, processes >= 1] (another program's key, or another version)")
    return chip, procs
