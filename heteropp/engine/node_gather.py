"""What every node of a torchrun launch is, told to all its workers before any process group forms: per
GROUP_RANK, the chip type its host says (HETEROPP_CHIP, None where unset), its process count
(LOCAL_WORLD_SIZE) and, where HETEROPP_CHIP is unset, the ditorch vendor its host chose (DITORCH_VENDOR, else
the first available) and the name its device reports (device_match.py; a node of an older version writes two
or three fields: vendor or name unknown). node_ranks.match_nodes reads it to know which entry of the run's
node list each node is.

It travels over torchrun's rendezvous store (env://, the store the default group then uses): each node's
local rank 0 writes one key, every worker waits for all of them. Where every round has a fresh store
(TORCHELASTIC_USE_AGENT_STORE not True: a c10d rendezvous with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1) the keys
are plain: the nodes of one round may disagree on TORCHELASTIC_RESTART_COUNT (an agent whose workers failed
counts a restart, one restarted for the membership change does not), so scoping by it would leave each waiting
for keys the others never write. The agent's store (torch's default) outlives the round, so there the keys are
scoped by the restart count, and a wait that times out says when another node wrote under another count. What
another node wrote is data: read and checked, never trusted.
"""
from __future__ import annotations

import datetime
import json
from typing import Mapping

from torch._C._distributed_c10d import Store
from torch.distributed import DistStoreError
from torch.distributed.rendezvous import rendezvous

from ..spec.errors import SpecError
from .device_match import MAX_NAME, host_device_name
from .node_ranks import Seen, env_int

_PREFIX = "heteropp/nodes"


def gather_nodes(env: Mapping[str, str], rank: int, world: int, timeout: datetime.timedelta
                 ) -> tuple[Store, dict[int, Seen]]:
    """torchrun's rendezvous store (env: torchrun's environment; rank and world: its RANK and WORLD_SIZE) and
    {GROUP_RANK: (chip type or None, process count, host vendor or None)} for every node of the launch.
    SpecError naming the variable when the launcher is not torchrun."""
    node, nodes = env_int(env, "GROUP_RANK"), env_int(env, "GROUP_WORLD_SIZE")
    local, procs = env_int(env, "LOCAL_RANK"), env_int(env, "LOCAL_WORLD_SIZE")
    restarts = env.get("TORCHELASTIC_RESTART_COUNT", "0")
    shared = env.get("TORCHELASTIC_USE_AGENT_STORE") == "True"  # the agent's store, kept across rounds
    prefix = f"{_PREFIX}/{restarts}" if shared else _PREFIX
    try:
        store, _, _ = next(rendezvous("env://", rank=rank, world_size=world, timeout=timeout))
    except DistStoreError as e:  # the worker hosting a fresh store waits for every worker to connect
        raise SpecError("torchrun", "WORLD_SIZE", f"not every one of the {world} workers reached the rendezvous "
                        f"store within {timeout.total_seconds():g} s ({str(e).splitlines()[0][:200]})",
                        "every worker of every node started") from None
    if local == 0:
        chip = env.get("HETEROPP_CHIP")
        vendor = None if chip else host_vendor(env)
        said = [None, None] if vendor is None else [vendor, host_device_name(vendor)]
        store.set(f"{prefix}/{node}", json.dumps([chip, procs, *said]))
    keys = [f"{prefix}/{g}" for g in range(nodes)]
    try:
        store.wait(keys, timeout)
    except DistStoreError:  # a node whose workers died (or hang) before saying what it is: name it
        missing = [g for g, k in enumerate(keys) if not store.check([k])]
        g = missing[0] if missing else 0
        most = env.get("TORCHELASTIC_MAX_RESTARTS", "0")
        elsewhere = [r for r in range(int(most) + 1 if shared and most.isdigit() else 0)
                     if str(r) != restarts and store.check([f"{_PREFIX}/{r}/{g}"])]
        hint = (f"; it wrote under restart {elsewhere[-1]}, this worker is at restart {restarts} (agents count "
                "restarts differently: set TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 on every agent of a c10d "
                "rendezvous, a fresh store every round)") if elsewhere else ""
        raise SpecError("torchrun", f"node {g}", f"wrote nothing to the rendezvous store within "
                        f"{timeout.total_seconds():g} s (nodes {missing} silent){hint}",
                        "every node's local rank 0 to say what it is") from None
    return store, {g: _read(g, store.get(k)) for g, k in enumerate(keys)}


def host_vendor(env: Mapping[str, str]) -> str:
    """The ditorch vendor this host runs on (its adapter's name), as `import ditorch` chooses it: DITORCH_VENDOR,
    else the first available, CPU last. SpecError naming DITORCH_VENDOR when it names no usable vendor."""
    from ditorch.registry import VENDOR_ENV, VendorError, select  # never at import: the fork server loads this

    try:
        return select(env.get(VENDOR_ENV))[0].name
    except VendorError as e:
        raise SpecError("torchrun", VENDOR_ENV, str(e), "a vendor this host has, or unset") from None


def _read(node: int, raw: bytes) -> Seen:
    """Node `node`'s entry as written by gather_nodes (or by a version that wrote no vendor or no device name);
    SpecError naming the node when it is not."""
    try:
        fields = json.loads(raw)
        # two fields: a version without vendors; three: without device names
        chip, procs, vendor, device = (*fields, None, None)[:4] if 2 <= len(fields) <= 4 else (None,) * 4
    except (ValueError, TypeError):
        chip = procs = vendor = device = None

    def text(v: object, most: int) -> bool:
        return v is None or (isinstance(v, str) and len(v) <= most)

    if not text(chip, MAX_NAME) or not isinstance(procs, int) or isinstance(procs, bool) or procs < 1 \
            or not text(vendor, MAX_NAME) or not text(device, MAX_NAME):
        raise SpecError("torchrun", f"node {node}", f"told the store {raw[:80]!r}",
                        f"[chip type or null, processes >= 1, vendor or null, device name or null], names of at most "
                        f"{MAX_NAME} characters (another program's key, or another version)")
    return Seen(chip, procs, vendor, device)
