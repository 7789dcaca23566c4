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


def _hang_at_exit(rank, world_size, store):
    import threading
    import time

    if rank == 1:  # a non-daemon thread keeps the process alive after it reported (bounded)
        threading.Thread(target=time.sleep, args=(60,), daemon=False).start()
    return rank


def _fail_at_exit(rank, world_size, store):
    import atexit

    if rank == 0:
        atexit.register(os._exit, 5)
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


def test_a_rank_that_reported_and_hangs_at_exit_fails_the_run_naming_it():
    with pytest.raises(RankFailure, match="rank 1 reported, then did not exit") as failure:
        run_ranks(_hang_at_exit, 2, timeout=5)
    assert "rank 0" not in str(failure.value)


def test_a_rank_that_reported_and_fails_at_exit_fails_the_run_naming_it():
    with pytest.raises(RankFailure, match="rank 0 reported, then exited with code 5"):
        run_ranks(_fail_at_exit, 2)
