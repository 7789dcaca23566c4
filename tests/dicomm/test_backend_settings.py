"""A group's engine settings through torch: `pg_options=DicommBackend.Options(settings={...})`.

The observable effect is the collective chunk size (DICOMM_COLL_CHUNK_BYTES): a 1 MiB broadcast from
rank 0 (the pipelined chain) sends one message per chunk, so with 64 KiB chunks the root sends
(1 MiB / 64 KiB) - (1 MiB / 512 KiB) = 14 messages more than with the default 512 KiB, everything
else being the same. The reference is that arithmetic, and root's bytes for the data. Real
processes, 2 ranks on CPU, one host.
"""
from __future__ import annotations

import copy
import datetime
import os
import traceback

import pytest
import torch
import torch.distributed as dist

from tests.dicomm.multiproc import run_ranks

CPU = torch.device("cpu")
SMALL_CHUNKS = {"DICOMM_COLL_CHUNK_BYTES": "65536"}
EXTRA_ROOT_MESSAGES = (1 << 20) // 65536 - (1 << 20) // (512 << 10)


def _broadcast_messages(group: dist.ProcessGroup, rank: int) -> tuple[int, bool]:
    """This rank's messages for one 1 MiB broadcast from group rank 0, and whether it got root's bytes."""
    from dicomm.backend import communicator_of

    comm = communicator_of(group)
    assert comm is not None
    want = torch.arange(1 << 18, dtype=torch.int32) * 7  # 1 MiB
    buf = want.clone() if group.rank() == 0 else torch.zeros_like(want)
    before = comm.stats()["messages_sent"]
    group.broadcast(buf, 0).wait()
    return comm.stats()["messages_sent"] - before, bool(torch.equal(buf, want))


def _groups_with_settings(rank: int, ws: int, store) -> dict:
    os.environ.pop("DICOMM_COLL_CHUNK_BYTES", None)  # the environment would override the settings
    import dicomm.backend  # noqa: F401  (registers the backend)
    from dicomm.backend import DicommBackend

    out: dict = {}
    try:
        dist.init_process_group(backend="dicomm", store=dist.PrefixStore("settings", store), rank=rank,
                                world_size=ws, timeout=datetime.timedelta(seconds=60),
                                pg_options=DicommBackend.Options(settings=SMALL_CHUNKS))
        world = dist.group.WORLD
        out["world"] = _broadcast_messages(world, rank)
        out["new_group plain"] = _broadcast_messages(dist.new_group([0, 1]), rank)
        given = DicommBackend.Options()
        given.settings = SMALL_CHUNKS  # assigned after construction, as a torch user may
        own = dist.new_group([0, 1], pg_options=given)
        out["new_group own"] = _broadcast_messages(own, rank)
        # What dist.split_group does with no pg_options (it refuses to run without an accelerator).
        inherited = world.split_group([0, 1], opts=copy.deepcopy(world._get_backend(CPU).options))
        out["split inherited"] = _broadcast_messages(inherited, rank)
        try:  # the same ranks and name as a live split: torch's store keys would be the same
            world.split_group([1, 0], opts=DicommBackend.Options())
        except ValueError as e:
            out["split again"] = str(e)
        own = world.split_group([1, 0], opts=DicommBackend.Options(), group_name="own")
        out["split own"] = _broadcast_messages(own, rank)
        merged = world.merge_remote_group(dist.PrefixStore("merge", store), ws, datetime.timedelta(seconds=45))
        out["merged"] = _broadcast_messages(merged, rank)
        out["merged rank"] = merged.rank()
        dist.barrier()
        dist.destroy_process_group()
    except Exception:  # reported, so the test shows the error rather than a hung peer
        out["error"] = traceback.format_exc(limit=-4)
    return out


def test_groups_keep_the_settings_of_their_options():
    results = run_ranks(_groups_with_settings, 2, timeout=150)
    for r in results:
        assert "error" not in r, r.get("error")
        for name, value in r.items():
            if name not in ("merged rank", "split again"):
                assert value[1], (name, results)  # root's bytes arrived
    root = results[0]
    merged_root = results[[r["merged rank"] for r in results].index(0)]["merged"][0]
    plain = root["new_group plain"][0]
    small = {name: root[name][0] for name in ("world", "new_group own", "split inherited")}
    small["merged"] = merged_root
    # Settings of pg_options reach the default group and a new group; a split or merge child
    # inherits its parent's unless given options of its own; new_group without options has none.
    assert small == dict.fromkeys(small, plain + EXTRA_ROOT_MESSAGES), results
    assert root["split own"][0] == plain, results
    for r in results:
        assert "already exists with other settings; give this one its own group_name" in r.get("split again", ""), r
    # The other rank sends the same number either way (it receives the chunks).
    assert results[1]["world"][0] == results[1]["new_group plain"][0], results


def _init_with(rank: int, ws: int, store, pg_options_of: str, settings: dict) -> str:
    import dicomm.backend  # noqa: F401  (registers the backend)
    from dicomm.backend import DicommBackend

    try:
        options = DicommBackend.Options(settings=settings) if pg_options_of == "dicomm" else settings
        dist.init_process_group(backend="dicomm", store=store, rank=rank, world_size=ws,
                                timeout=datetime.timedelta(seconds=20), pg_options=options)
    except Exception as e:
        return f"{type(e).__module__}.{type(e).__name__}: {e}"
    dist.destroy_process_group()
    return "no error"


@pytest.mark.parametrize("pg_options_of, settings, message", [
    ("dicomm", {"DICOMM_COLL_CHUNK_BYTES": "0"},
     "ValueError: .*DICOMM_COLL_CHUNK_BYTES='0' is not valid; expected an integer >= 1"),
    ("dicomm", {"DICOMM_NO_SUCH_KNOB": "1"}, "ValueError: .*unknown setting 'DICOMM_NO_SUCH_KNOB'"),
    ("dicomm", {"DICOMM_LOG_LEVEL": "debug"}, "ValueError: .*DICOMM_LOG_LEVEL cannot be set per communicator"),
    ("dicomm", {"DICOMM_COLL_CHUNK_BYTES": 65536},
     r"TypeError: DicommBackend.Options: settings map variable names to text, got 'DICOMM_COLL_CHUNK_BYTES': 65536"),
    ("dict", {"DICOMM_COLL_CHUNK_BYTES": "65536"},
     r"TypeError: pg_options for the dicomm backend must be dicomm.backend.DicommBackend.Options"),
])
def test_a_bad_setting_fails_init_naming_it(pg_options_of, settings, message):
    import re

    [said] = run_ranks(_init_with, 1, pg_options_of, settings, timeout=60)
    assert re.search(message, said), said
