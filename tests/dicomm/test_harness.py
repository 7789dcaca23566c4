"""The multi-process harness itself: real processes, real store, failures reported, no hangs."""
import os

import pytest

from tests.dicomm.multiproc import RankFailure, run_ranks


def _exchange(rank, world_size, store):
    store.set(f"k{rank}", str(rank * 10))
    return [int(store.get(f"k{r}")) for r in range(world_size)]


def _fail_on_one(rank, world_size, store):
    if rank == 1:
        raise ValueError("deliberate failure on rank 1")
    return rank


def _die(rank, world_size, store):
    if rank == 0:
        os._exit(3)
    return rank


def test_ranks_share_a_store():
    assert run_ranks(_exchange, 3) == [[0, 10, 20]] * 3


def test_a_raising_rank_fails_the_run_with_its_traceback():
    with pytest.raises(RankFailure, match="deliberate failure on rank 1"):
        run_ranks(_fail_on_one, 2)


def test_a_dead_rank_is_reported_unless_expected():
    with pytest.raises(RankFailure, match="rank 0 exited with code 3"):
        run_ranks(_die, 2)
    assert run_ranks(_die, 2, expect_dead=[0]) == [None, 1]
