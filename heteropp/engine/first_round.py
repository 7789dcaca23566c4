"""The hosts `heteropp run --elastic` starts join their first rendezvous round together.

torch elastic closes a round `last_call_timeout` (1 s, elastic_launch.RDZV_CONF) after its last member joined
once `min_nodes` (1: a survivor must be able to go on alone) have. Hosts started at the same moment reach the
rendezvous each after importing torch, which on a busy machine spreads them by more than that second: the first
round then formed without the late host, and the next round, a second later, took it in, restarting every
worker. So each agent the launcher starts first counts itself in the launcher's store and waits until every one
of them has (at most FIRST_ROUND_WAIT_S), then joins. A host started again later is not counted (its
environment has no FIRST_ROUND_ENV) and joins at once."""
from __future__ import annotations

import datetime
import os
import sys
import time

# "<hosts> <rendezvous id> <store host>:<port>", set by elastic_launch.launch_hosts
FIRST_ROUND_ENV = "HETEROPP_FIRST_ROUND"
FIRST_ROUND_WAIT_S = 60.0  # then it joins anyway: a host that never started must not hold the others
POLL_S = 0.02


def wait_for_the_others() -> None:
    """Counts this host in and waits for the launcher's other first hosts (FIRST_ROUND_ENV); nothing without it."""
    spec = os.environ.pop(FIRST_ROUND_ENV, "")  # not inherited by the workers, nor by a restarted host
    if not spec:
        return
    count, run_id, endpoint = spec.split()
    host, _, port = endpoint.rpartition(":")
    from torch.distributed import TCPStore

    store = TCPStore(host, int(port), is_master=False, timeout=datetime.timedelta(seconds=FIRST_ROUND_WAIT_S))
    key = f"heteropp/first_round/{run_id}"
    joined = store.add(key, 1)
    deadline = time.monotonic() + FIRST_ROUND_WAIT_S
    while joined < int(count) and time.monotonic() < deadline:
        time.sleep(POLL_S)
        joined = store.add(key, 0)
    if joined < int(count):
        print(f"heteropp elastic: {joined} of the {count} hosts started reached the rendezvous in "
              f"{FIRST_ROUND_WAIT_S:.0f} s; this one joins without the others", file=sys.stderr, flush=True)
