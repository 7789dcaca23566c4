"""Restarts under torchelastic (issue 27, point 4): torchrun keeps its rendezvous store across
restart rounds, so the keys the previous round's ranks wrote are still there when the new round
starts. A restarted job must never meet the previous round's ranks (their token, their cards); and the
ranks of one round must meet even when their agents disagree on the restart count, where the store is
fresh every round (or say why they cannot, on the shared one).

The first test runs real torchrun, two worker processes, one of which SIGKILLs itself on the first
attempt; the others run two spawned processes on a real TCPStore, each with the environment an agent
would give it."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

from tests.dicomm.multiproc import run_ranks, store_server

WORKER = Path(__file__).with_name("elastic_worker.py")


def test_a_torchelastic_restart_meets_only_its_own_round(tmp_path):
    out = tmp_path / "result.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DICOMM_", "TORCHELASTIC_"))}
    env.pop("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", None)  # torch's default: one store for every round
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "--max-restarts=1", "--monitor-interval=0.1", str(WORKER), str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    got = json.loads(out.read_text())
    # The reference: 2 ranks, the second attempt's values 10 * (rank + 1) + 1.
    assert got == {"attempt": 1, "world": 2, "sum": [11.0 + 21.0] * 4}


# The nodes of one elastic round may disagree on TORCHELASTIC_RESTART_COUNT: an agent whose worker failed
# counts a restart, one restarted for the membership change does not. Two spawned processes on a real
# TCPStore stand in for two nodes' workers; each sets its own count (and torch's store flag) before it
# creates its group, as the agent's environment would.
# Ranks that meet never wait this long (a loaded host's start-up skew stays well below it); ranks that
# wait for keys nobody writes fail after it.
MEET_TIMEOUT_S = 15.0
STALL_TIMEOUT_S = 6.0  # the disagreeing shared-store run waits this long, then must say why


def _set_round(rank: int, counts: list[int], agent_store: str) -> None:
    os.environ["TORCHELASTIC_RESTART_COUNT"] = str(counts[rank])
    os.environ["TORCHELASTIC_USE_AGENT_STORE"] = agent_store


def _inputs(rank: int):
    import torch

    return torch.randn(1000, generator=torch.Generator().manual_seed(rank))


def _meet(rank, ws, store, counts, agent_store, with_gloo):
    """This rank's dicomm all_reduce of _inputs(rank), and gloo's of the same inputs (None without)."""
    import torch.distributed as dist

    _set_round(rank, counts, agent_store)
    dist.init_process_group("dicomm", store=dist.PrefixStore("job", store), rank=rank, world_size=ws,
                            timeout=timedelta(seconds=MEET_TIMEOUT_S))
    got = _inputs(rank)
    dist.all_reduce(got)
    ref = None
    if with_gloo:
        ref = _inputs(rank)
        dist.all_reduce(ref, group=dist.new_group(backend="gloo"))
    dist.destroy_process_group()
    return got.tolist(), None if ref is None else ref.tolist()


def test_ranks_that_disagree_on_the_restart_count_meet_on_a_fresh_store():
    """A fresh store every round (TORCHELASTIC_USE_AGENT_STORE=False: a c10d rendezvous with
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1) holds nothing stale: rank 0 at restart count 1 and rank 1 at 0
    meet, and their all_reduce equals gloo's."""
    out = run_ranks(_meet, 2, [1, 0], "False", True, timeout=90)
    for got, ref in out:
        assert got == ref
    assert out[0][0] == out[1][0]


def test_a_plain_launch_ignores_the_restart_count():
    """No torchelastic flag at all (a plain launch with a stray TORCHELASTIC_RESTART_COUNT): no scoping by it."""
    out = run_ranks(_meet, 2, [0, 3], "", True, timeout=90)
    for got, ref in out:
        assert got == ref


def _stall(rank, ws, store, counts):
    """What this rank's group creation and first all_reduce raise on the shared agent store."""
    import torch
    import torch.distributed as dist

    _set_round(rank, counts, "True")
    try:
        dist.init_process_group("dicomm", store=dist.PrefixStore("job", store), rank=rank, world_size=ws,
                                timeout=timedelta(seconds=STALL_TIMEOUT_S))
        dist.all_reduce(torch.ones(4))
    except Exception as e:  # noqa: BLE001  (the test reads what each rank was told)
        return f"{type(e).__name__}: {e}"
    return "met"


def test_disagreeing_restart_counts_on_the_agent_store_say_why_they_do_not_meet():
    """On torch's shared agent store (TORCHELASTIC_USE_AGENT_STORE=True) the keys stay scoped by the count,
    so ranks at counts 1 and 0 cannot meet: each fails at its timeout naming both counts and the remedy (rank 1
    in group creation, waiting for rank 0's token; rank 0 in its first all_reduce, waiting for rank 1's card)."""
    out = run_ranks(_stall, 2, [1, 0], timeout=90)
    for err in out:
        assert "TimeoutError" in err, err
        assert "restart count 1" in err and "restart count 0" in err, err
        assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in err, err
    # The collective's own timeout, or its card fetch's, whichever passes first (eager or lazy connects).
    assert re.search(r"rank 1 (has not|never) published its address card", out[0]), out[0]
    assert "rank 1 waited for rank 0 to publish the job token" in out[1], out[1]


def test_agreeing_restart_counts_on_the_agent_store_skip_an_earlier_rounds_keys():
    """The agent's store outlives the round: a first round (count 0) writes its token and cards, then ends;
    the second round (count 1, same TCPStore server) meets without reading them. The first round's keys are
    overwritten with garbage before the second starts, so reading any of them would fail."""

    server = store_server()
    run_ranks(_meet, 2, [0, 0], "True", False, timeout=90, server=server)
    # The first round's keys on the agent's store (docs/architecture.md: count 0, world 2, first round),
    # under torch's prefixes for the default group ("<group name>/", then "<device>/") beneath "job".
    for key in ("dicomm/0.w2.0/token", "dicomm/0.w2.0/card/0", "dicomm/0.w2.0/card/1"):
        assert server.check([f"job/0//cpu//{key}"]), key
        server.set(f"job/0//cpu//{key}", "left by an earlier round")
    out = run_ranks(_meet, 2, [1, 1], "True", True, timeout=90, server=server)
    for got, ref in out:
        assert got == ref


def _wait_alone(rank, ws, store):
    """Rank 1 creates its group on the agent store; rank 0 never does."""
    if rank == 0:
        return ""
    return _stall(rank, ws, store, [0, 0])


def test_a_foreign_entry_in_the_agent_store_is_not_taken_for_a_restart_count():
    """What the store says another rank entered under is data: a value that is no count (another program's key)
    leaves the plain timeout error, which asks whether rank 0 started."""

    server = store_server()
    server.set("job/0//cpu//dicomm/entered/0", "1; rm -rf")  # where rank 0's entry would be (see above)
    err = run_ranks(_wait_alone, 2, timeout=60, server=server)[1]
    assert "rank 1 waited for rank 0 to publish the job token" in err and "did rank 0 start?" in err, err
    assert "restart count" not in err, err


def test_a_round_that_grows_at_the_same_restart_count_skips_an_earlier_rounds_keys():
    """A membership change (a node joins) restarts the workers without moving TORCHELASTIC_RESTART_COUNT
    (torch's agent counts only failed rounds), so on the agent's store two rounds share a count: a first
    round of one rank, then one of two ranks. Rank 1 of the second round is new to the store; it must not
    take the first round's token or rank 0's card (a process gone), which would fail its connection. Its
    all_reduce equals gloo's."""

    server = store_server()
    run_ranks(_meet, 1, [0], "True", False, timeout=90, server=server)
    out = run_ranks(_meet, 2, [0, 0], "True", True, timeout=90, server=server)
    for got, ref in out:
        assert got == ref
