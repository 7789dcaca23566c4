"""Checkpoints of a plan whose replica groups run different pipelines (Plan.replicas), in real processes (CPU
tensors and gloo stand in for two chip types and their libraries), of a model whose head is its embedding: a
run resumed from its step-2 checkpoint continues bit for bit as the run that never stopped (losses and every
holder's weights), which itself follows the single-process reference; and the checkpoint is the plan's no
more than any other: one written by the replica groups resumes on a plan of one stage list (other cuts, TP
sizes and micro-batches) and one written by that plan resumes on the replica groups, both following the
reference; it also resumes on replica groups that shard the optimizer state otherwise and in one process. The
groups run with ZeRO-1 (the default): each part's Adam state is sharded over its holders. The whole run saves in
the background (async_save, the default), the resumed ones in the foreground."""
from __future__ import annotations

import dataclasses
import functools
import shutil
from pathlib import Path

import pytest
import torch

from heteropp.engine import RunConfig, launch, train_reference
from heteropp.engine.checkpoint import complete_checkpoints
from heteropp.engine.config import TrainOptions
from heteropp.plan import Plan, ReplicaGroup, StagePlan
from tests.heteropp.heteropp_helpers import MODEL, check_losses, holder_params, mismatches

STEPS, SAVE = 4, 2
# the head is the embedding: its copy on a last stage is not written, and is read from the embedding's key
TIED = dataclasses.replace(MODEL, tie_embeddings=True)
# ZeRO-1 (the default, said here so that the test keeps it): each part's Adam state sharded over its holders
OPTIONS = {"warmup_steps": 1, "lr_decay": "cosine", "min_lr": 1e-4, "save_every": SAVE, "zero1": True}
# A: two stages of 2 layers, 3 micro-batches; B: 1 + 3 layers, 5 micro-batches (global batch 8)
GROUPS = Plan.of_replicas([ReplicaGroup([StagePlan("A", 1, 2), StagePlan("A", 1, 2)], 3),
                           ReplicaGroup([StagePlan("B", 1, 1), StagePlan("B", 1, 3)], 5)], 1,
                          schedule="1f1b", num_layers=TIED.layers)
# one stage list over the same 8 sequences: layers 0-2 at TP 2 (TP 1 in the groups), micro-batches of 2
# weights against the reference after 4 Adam steps: the update divides by the moments' square root, which
# magnifies the fp32 rounding of gradients summed in another order (1e-5 holds for 3 steps, tests of groups)
PARAM_RTOL = 1e-4
ONE_LIST = Plan([StagePlan("A", 2, 3), StagePlan("B", 1, 1)], dp=1, micro_batch_size=2, micro_batches=4,
                num_layers=TIED.layers, schedule="1f1b")
# other replica groups: B cut 3 + 1 in two pipelines of 2 micro-batches, A one stage of 4: every part's state is
# sharded 3 ways (2 ways in GROUPS), the head's copy 2 ways, and group A's one stage holds both ends as one matrix
OTHER_GROUPS = Plan.of_replicas([ReplicaGroup([StagePlan("B", 1, 3), StagePlan("B", 1, 1)], 2, dp=2),
                                 ReplicaGroup([StagePlan("A", 1, 4)], 4)], 1,
                                schedule="1f1b", num_layers=TIED.layers, zero1=True)


def _launch(plan: Plan, ck, steps: int = STEPS, **options) -> dict:
    cfg = RunConfig(plan=plan.to_dict(), model=RunConfig.model_dict(TIED), steps=steps, backend="gloo",
                    chip_map={"A": "cpu", "B": "cpu"}, timeout_s=120, collect_params=True,
                    options={**OPTIONS, "checkpoint_dir": str(ck), **options})
    return launch(cfg)


def _losses(results: dict) -> list[float]:
    """The loss of every step the run trained, as every last stage (of every group) reports it."""
    got = [r["1f1b"]["losses"] for r in results.values() if r["1f1b"]["losses"] is not None]
    assert got and all(g == got[0] for g in got), got
    return got[0]


@functools.lru_cache(maxsize=None)
def _reference(**options) -> dict:
    """The single-process run; `options`: more TrainOptions (a checkpoint to resume from)."""
    return train_reference(TIED, STEPS, GROUPS.global_batch, collect_params=True, verbose=False,
                           opts=TrainOptions(**{k: v for k, v in OPTIONS.items() if k != "save_every"}, **options))


def _step2(ck, tmp) -> str:
    """A directory holding only `ck`'s step-2 checkpoint (the one a resumed run starts from)."""
    shutil.copytree(ck / f"step-{SAVE:08d}", tmp / f"step-{SAVE:08d}")
    return str(tmp)


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> tuple[dict, Path]:
    """The replica groups' run that never stopped, with its checkpoints (steps 2 and 4)."""
    ck = tmp_path_factory.mktemp("whole")
    return _launch(GROUPS, ck), ck


def test_replica_groups_resume_from_their_checkpoint_bit_for_bit(whole, tmp_path) -> None:
    results, ck = whole
    assert [p.name for p in complete_checkpoints(ck)] == ["step-00000002", "step-00000004"]
    check_losses(_losses(results), _reference()["losses"], "replica groups")
    resumed = _launch(GROUPS, _step2(ck, tmp_path / "resumed"), resume=True, async_save=False)
    assert {r["1f1b"]["start_step"] for r in resumed.values()} == {SAVE}
    assert _losses(resumed) == _losses(results)[SAVE:]  # value for value
    got, want = holder_params(resumed, "1f1b", tied=True), holder_params(results, "1f1b", tied=True)
    assert set(got) == set(want) and all(torch.equal(got[n], want[n]) for n in want)
    assert not mismatches(got, _reference()["params"], PARAM_RTOL)


@pytest.mark.slow
def test_a_checkpoint_resumes_across_replica_groups_and_one_stage_list(whole, tmp_path) -> None:
    ref = _reference()
    # replica groups -> one stage list
    on_list = _launch(ONE_LIST, _step2(whole[1], tmp_path / "groups"), resume=True, async_save=False)
    check_losses(_losses(on_list), ref["losses"][SAVE:], "groups' checkpoint on one stage list")
    assert not mismatches(holder_params(on_list, "1f1b", tied=True), ref["params"], PARAM_RTOL)
    # one stage list -> replica groups
    _launch(ONE_LIST, tmp_path / "list")
    on_groups = _launch(GROUPS, _step2(tmp_path / "list", tmp_path / "from-list"), resume=True, async_save=False)
    check_losses(_losses(on_groups), ref["losses"][SAVE:], "one stage list's checkpoint on the groups")
    assert not mismatches(holder_params(on_groups, "1f1b", tied=True), ref["params"], PARAM_RTOL)


def test_a_zero1_checkpoint_of_replica_groups_resumes_on_other_groups_and_in_one_process(whole, tmp_path) -> None:
    """The groups' step-2 checkpoint (each part's Adam moments written from its holders' ZeRO-1 shards) resumes on
    replica groups sharded otherwise and in one process (`heteropp reference --resume`): both continue as the
    reference that never stopped, so the moments were whole when written."""
    ref = _reference()
    assert OTHER_GROUPS.global_batch == GROUPS.global_batch
    on_other = _launch(OTHER_GROUPS, _step2(whole[1], tmp_path / "other"), resume=True, async_save=False)
    assert {r["1f1b"]["start_step"] for r in on_other.values()} == {SAVE}
    check_losses(_losses(on_other), ref["losses"][SAVE:], "groups' checkpoint on other groups")
    assert not mismatches(holder_params(on_other, "1f1b", tied=True), ref["params"], PARAM_RTOL)
    one = _reference(checkpoint_dir=_step2(whole[1], tmp_path / "one"), resume=True)
    assert one["start_step"] == SAVE
    check_losses(one["losses"], ref["losses"][SAVE:], "groups' checkpoint in one process")
    assert not mismatches(one["params"], ref["params"], PARAM_RTOL)


def test_heteropp_run_takes_a_checkpoint_dir_for_replica_groups(tmp_path) -> None:
    """`heteropp run --checkpoint-dir --resume` on a plan of replica groups writes a config that checkpoints and
    resumes (it exited 2: replica groups trained without checkpoints)."""
    import json

    from heteropp.cli import main
    GROUPS.save(tmp_path / "plan.json")
    model = tmp_path / "model.json"
    model.write_text(json.dumps({k: v for k, v in RunConfig.model_dict(TIED).items() if k != "explicit_head_dim"}))
    assert main(["run", "--plan", str(tmp_path / "plan.json"), "--model", str(model), "--chip-map", "A=cpu,B=cpu",
                 "--checkpoint-dir", str(tmp_path / "ck"), "--resume", "--save-every", "2",
                 "--write-config", str(tmp_path / "run.json")]) == 0
    options = json.loads((tmp_path / "run.json").read_text())["options"]
    assert (options["checkpoint_dir"], options["resume"], options["save_every"]) == (str(tmp_path / "ck"), True, 2)
