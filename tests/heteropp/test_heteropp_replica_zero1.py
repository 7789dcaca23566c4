"""ZeRO-1 in a plan whose replica groups run different pipelines (Plan.replicas): each rank keeps the Adam state
of only its shard of every part it holds (a layer, the embedding, the final norm and head; with tied embeddings
the embedding and the head's copy each on their own), sharded over every rank of every group that holds that
part. Real processes (CPU tensors and gloo stand in for two chip types and their libraries), each plan with and
without ZeRO-1: the losses of every step and every holder's final weights follow the single-process reference,
clipping included, and each rank's Adam state, read from its optimizer, is its shard's size (the whole of its
parts without ZeRO-1); in fp16 a run with ZeRO-1 trains as one without. A ZeRO-1 run's checkpoint resumes bit
for bit, and resumes without ZeRO-1 as the reference continues. The plan and `heteropp run` take zero1 with
replica groups."""
from __future__ import annotations

import argparse
import dataclasses
import functools
import shutil
from pathlib import Path

import pytest
import torch

from heteropp.cli import zero1_of
from heteropp.engine import RunConfig, launch, train_reference
from heteropp.plan import Plan, ReplicaGroup, StagePlan
from tests.heteropp.heteropp_helpers import MODEL, check_losses, holder_params, mismatches

STEPS, SAVE = 3, 2
CLIP = 0.05  # below this model's gradient norm, so every step clips (the norm counts each element once)
TIED = dataclasses.replace(MODEL, tie_embeddings=True)
# A: two stages of 2 layers, 2 micro-batches; B: 1 + 3 layers in two pipelines of 3 micro-batches: every part
# has 3 holders (one rank of A, two of B), which divide no part's size
UNTIED = Plan.of_replicas([ReplicaGroup([StagePlan("A", 1, 2), StagePlan("A", 1, 2)], 2),
                           ReplicaGroup([StagePlan("B", 1, 1), StagePlan("B", 1, 3)], 3, dp=2)], 1,
                          schedule="1f1b", num_layers=MODEL.layers)
# A: one stage holds both ends (one matrix); B: the embedding on stage 0, its copy as the head on stage 1, two
# pipelines: the embedding has 3 holders, the copy 2, the final norm 3
TIED_PLAN = Plan.of_replicas([ReplicaGroup([StagePlan("A", 1, 4)], 2),
                              ReplicaGroup([StagePlan("B", 1, 1), StagePlan("B", 1, 3)], 3, dp=2)], 1,
                             schedule="1f1b", num_layers=MODEL.layers)
# layer 0 and the embedding at TP 2 in both groups (A cut 1|3, B cut 1|1|2): each TP shard of a part has 2 holders
TP2 = Plan.of_replicas([ReplicaGroup([StagePlan("A", 2, 1), StagePlan("A", 1, 3)], 2),
                        ReplicaGroup([StagePlan("B", 2, 1), StagePlan("B", 1, 1), StagePlan("B", 1, 2)], 3)], 1,
                       schedule="1f1b", num_layers=MODEL.layers)
CASES = {"untied": (UNTIED, MODEL, CLIP), "tied": (TIED_PLAN, TIED, None), "tp2": (TP2, MODEL, None)}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the tied runs leave their checkpoints (the resume tests start from step SAVE's)."""
    return tmp_path_factory.mktemp("replica-zero1")


def _launch(plan: Plan, model, steps: int, clip: float | None, **options) -> dict:
    cfg = RunConfig(plan=plan.to_dict(), model=RunConfig.model_dict(model), steps=steps, schedules=["1f1b"],
                    backend="gloo", chip_map={"A": "cpu", "B": "cpu"}, collect_params=True, timeout_s=120,
                    clip_grad=clip, options=options)
    return launch(cfg)


@functools.lru_cache(maxsize=None)
def _run(case: str, zero1: bool, root: Path) -> dict:
    plan, model, clip = CASES[case]
    ck = {"checkpoint_dir": str(root / f"{case}-{zero1}"), "save_every": SAVE} if case == "tied" else {}
    return _launch(plan, model, STEPS, clip, zero1=zero1, **ck)


@functools.lru_cache(maxsize=None)
def _reference(case: str, steps: int = STEPS) -> dict:
    plan, model, clip = CASES[case]
    return train_reference(model, steps, plan.global_batch, clip_grad=clip, collect_params=True, verbose=False)


def _losses(results: dict) -> list[float]:
    got = [r["1f1b"]["losses"] for r in results.values() if r["1f1b"]["losses"] is not None]
    assert len(got) >= 2 and all(g == got[0] for g in got), got  # every last stage of every group reports it
    return got[0]


def _holders(plan: Plan, bucket: str) -> int:
    """Ranks per TP shard that hold `bucket` (a layer's index, "embed", "head", or a tied matrix's name), counted
    from the plan: the stage of every group that holds it, times that stage's replicas."""
    n = 0
    for g in plan.groups:
        last = len(g.stages) - 1
        for k, s in enumerate(g.stages):
            held = {"embed": k == 0, "embed.weight": k == 0, "head": k == last,
                    "head.weight": k == last and last > 0}.get(bucket)
            n += g.stage_dp(k) if (held if held is not None else int(bucket) in s.layer_range) else 0
    return n


def _bucket(name: str, tied: bool) -> str:
    if tied and name in ("embed.weight", "head.weight"):
        return name
    return name.split(".")[1] if name.startswith("layers.") else "embed" if name.startswith("embed.") else "head"


@pytest.mark.parametrize("zero1", [True, False])
@pytest.mark.parametrize("case", sorted(CASES))
def test_replica_groups_train_as_the_reference(root: Path, case: str, zero1: bool) -> None:
    """With ZeRO-1 every holder steps its shard of each part and gathers the rest; without, every holder steps
    all of it: either way the reference's losses and weights (the untied case clips every step: the norm counts
    each element once, over every part's shards)."""
    res, want = _run(case, zero1, root), _reference(case)
    if CASES[case][2] is not None:
        assert all(n > CLIP for n in want["grad_norms"]), "the test must clip"
    check_losses(_losses(res), want["losses"], f"{case} zero1={zero1}")
    assert not mismatches(holder_params(res, "1f1b", tied=case == "tied"), want["params"])


@pytest.mark.parametrize("zero1", [True, False])
@pytest.mark.parametrize("case", sorted(CASES))
def test_each_rank_keeps_the_adam_state_of_its_shards(root: Path, case: str, zero1: bool) -> None:
    plan = CASES[case][0]
    res = _run(case, zero1, root)
    assert len(res) == plan.world_size
    for rank, r in res.items():
        sizes: dict[str, int] = {}
        for name, (weight, _, _) in r["1f1b"]["params"].items():  # this rank's TP shard of each
            b = _bucket(name, case == "tied")
            sizes[b] = sizes.get(b, 0) + weight.numel()
        want = sum(-(-n // _holders(plan, b)) if zero1 else n for b, n in sizes.items())
        assert r["1f1b"]["optim_state_elems"] == want, (
            f"{case} rank {rank} zero1={zero1}: Adam state of {r['1f1b']['optim_state_elems']} elements, want {want} "
            f"(parts {sizes})")


def test_fp16_with_zero1_trains_as_without() -> None:
    """fp16 weights: each holder keeps fp32 master weights of its shards only, unscales them by the one loss
    scale of every part, and gathers the parts' fp16 roundings: the same losses, scale and weights as every
    holder stepping its parts whole."""
    on, off = (_launch(UNTIED, MODEL, STEPS, None, zero1=z, dtype="fp16") for z in (True, False))
    assert _losses(on) == _losses(off) and _losses(on) != _reference("untied")["losses"]
    assert [r["1f1b"]["skipped_steps"] for r in on.values()] == [r["1f1b"]["skipped_steps"] for r in off.values()]
    got = holder_params(on, "1f1b")
    assert all(t.dtype == torch.float16 for t in got.values())
    assert not mismatches(got, holder_params(off, "1f1b"))


def _from_step(root: Path, tmp: Path) -> str:
    """A directory holding only the tied ZeRO-1 run's step-SAVE checkpoint."""
    _run("tied", True, root)
    shutil.copytree(root / "tied-True" / f"step-{SAVE:08d}", tmp / f"step-{SAVE:08d}")
    return str(tmp)


def test_a_zero1_checkpoint_resumes_bit_for_bit(root: Path, tmp_path: Path) -> None:
    """Saved at step SAVE by every part's holders gathering their shards, loaded by each into its shard: the
    resumed run's losses and weights are the uninterrupted run's, value for value."""
    whole = _run("tied", True, root)
    resumed = _launch(TIED_PLAN, TIED, STEPS, None, zero1=True, resume=True, async_save=False,
                      checkpoint_dir=_from_step(root, tmp_path / "ck"))
    assert {r["1f1b"]["start_step"] for r in resumed.values()} == {SAVE}
    assert _losses(resumed) == _losses(whole)[SAVE:]
    got, want = holder_params(resumed, "1f1b", tied=True), holder_params(whole, "1f1b", tied=True)
    assert set(got) == set(want) and all(torch.equal(got[n], want[n]) for n in want)


def test_a_zero1_checkpoint_resumes_without_zero1(root: Path, tmp_path: Path) -> None:
    want = _reference("tied", STEPS + 1)
    res = _launch(TIED_PLAN, TIED, STEPS + 1, None, zero1=False, resume=True, async_save=False,
                  checkpoint_dir=_from_step(root, tmp_path / "ck"))
    check_losses(_losses(res), want["losses"][SAVE:], "zero1 checkpoint resumed without zero1")
    assert not mismatches(holder_params(res, "1f1b", tied=True), want["params"])


def _replica_dict(**extra) -> dict:
    d = UNTIED.to_dict()
    d.pop("zero1", None)
    return {**d, **extra}


def test_a_replica_plan_without_the_field_loads_as_priced_by_heteroauto_without_zero1():
    assert Plan.from_dict(_replica_dict()).zero1 is False


@pytest.mark.parametrize("zero1", [True, False])
def test_a_replica_plan_takes_zero1(zero1: bool) -> None:
    assert Plan.from_dict(_replica_dict(zero1=zero1), "plan.json").zero1 is zero1


def test_the_zero1_flags_on_a_replica_plan_win() -> None:
    plan = Plan.from_dict(_replica_dict(zero1=False))
    assert zero1_of(argparse.Namespace(zero1=True), plan) is True
    assert zero1_of(argparse.Namespace(zero1=None), plan) is False
    assert zero1_of(argparse.Namespace(zero1=False), Plan.from_dict(_replica_dict(zero1=True))) is False


def test_a_plan_of_one_stage_list_keeps_its_default():
    d = Plan([StagePlan("A", 1, 4)], dp=1, micro_batch_size=1, micro_batches=2, num_layers=4).to_dict()
    d.pop("zero1", None)
    assert Plan.from_dict(d).zero1 is True
