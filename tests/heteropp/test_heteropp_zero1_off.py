"""`zero1: false` as HeteroAuto prices it: every data-parallel rank keeps the whole fp32 optimizer state and
applies the whole update after the gradient all-reduce (no all-gather). Real processes (two stages, dp 2;
CPU tensors and gloo stand in for chips and their collective library): each rank's Adam state holds its
whole stage, and the losses and final parameters equal the single-process reference's and the ZeRO-1
run's. Checkpoints written either way resume the other way, as the reference continues."""
from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path

import pytest

from heteropp.cli import main
from heteropp.engine import launch, train_reference
from heteropp.engine.config import TrainOptions
from tests.heteropp.heteropp_helpers import MODEL, check_losses, config, full_params, losses, mismatches, plan

STEPS, LR = 3, 3e-3
RTOL_UPDATED = 1e-4  # after optimizer steps, as test_heteropp_multistep.py (its comment says why)
CLIP = 0.05  # below this model's gradient norm, so every step clips (the norm counts each element once)
PLAN = plan([(1, 2, False), (1, 2, False)], dp=2)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the unclipped runs leave their last step's checkpoint (the resume test starts from it)."""
    return tmp_path_factory.mktemp("zero1")


@functools.lru_cache(maxsize=None)
def _run(zero1: bool, root: Path, clip: float | None = None) -> dict:
    options: dict = {"zero1": zero1}
    if clip is None:
        options["checkpoint_dir"] = str(root / f"zero1-{zero1}")
    return launch(config(PLAN, ("1f1b",), steps=STEPS, lr=LR, clip_grad=clip, collect_params=True, options=options))


@functools.lru_cache(maxsize=None)
def _reference(clip: float | None = None) -> dict:
    return train_reference(MODEL, STEPS, PLAN.global_batch, lr=LR, clip_grad=clip, collect_params=True,
                           verbose=False)


@pytest.mark.parametrize("zero1", [False, True])
def test_each_dp_rank_keeps_the_whole_optimizer_state_only_without_zero1(root: Path, zero1: bool) -> None:
    res = _run(zero1, root)
    assert len(res) == 4
    for rank, r in res.items():
        stage = sum(t.numel() for t, _, _ in r["1f1b"]["params"].values())  # TP 1: the rank holds its stage
        want = stage if not zero1 else -(-stage // 2)
        assert r["1f1b"]["optim_state_elems"] == want, (
            f"rank {rank} zero1={zero1}: Adam state of {r['1f1b']['optim_state_elems']} elements, want {want}")


@pytest.mark.parametrize("zero1", [False, True])
def test_losses_and_final_parameters_equal_the_reference(root: Path, zero1: bool) -> None:
    want = _reference()
    check_losses(losses(_run(zero1, root), "1f1b"), want["losses"], f"zero1={zero1}", rtol=RTOL_UPDATED)
    assert not mismatches(full_params(_run(zero1, root), "1f1b"), want["params"], rtol=RTOL_UPDATED)


def test_without_zero1_clipping_counts_each_gradient_element_once(root: Path) -> None:
    """Every DP rank holds the whole gradient: the global norm is the reference's, not dp times its square."""
    want = _reference(CLIP)
    assert all(n > CLIP for n in want["grad_norms"]), "the test must clip"
    res = _run(False, root, CLIP)
    check_losses(losses(res, "1f1b"), want["losses"], "zero1=False clipped", rtol=RTOL_UPDATED)
    assert not mismatches(full_params(res, "1f1b"), want["params"], rtol=RTOL_UPDATED)


def test_without_zero1_the_final_parameters_equal_the_zero1_runs(root: Path) -> None:
    off, on = full_params(_run(False, root), "1f1b"), full_params(_run(True, root), "1f1b")
    assert not mismatches(off, on, rtol=RTOL_UPDATED)


@pytest.mark.parametrize("saved,resumed", [(False, True), (True, False)])
def test_a_checkpoint_saved_one_way_resumes_the_other(root: Path, tmp_path: Path, saved: bool,
                                                      resumed: bool) -> None:
    """Saved after STEPS steps with zero1 `saved`, one more step with `resumed`: the reference's STEPS + 1."""
    _run(saved, root)
    ck = str(tmp_path / "ck")
    shutil.copytree(root / f"zero1-{saved}", ck)  # the resumed run saves its own step into it
    res = launch(config(PLAN, ("1f1b",), steps=STEPS + 1, lr=LR, collect_params=True,
                        options={"zero1": resumed, "checkpoint_dir": ck, "resume": True}))
    want = train_reference(MODEL, STEPS + 1, PLAN.global_batch, lr=LR, collect_params=True, verbose=False,
                           opts=TrainOptions())
    check_losses(losses(res, "1f1b"), want["losses"][STEPS:], f"{saved}->{resumed}", rtol=RTOL_UPDATED)
    assert not mismatches(full_params(res, "1f1b"), want["params"], rtol=RTOL_UPDATED)


@pytest.mark.parametrize("flag,want", [([], True), (["--no-zero1"], False)])
def test_heteropp_run_passes_zero1_to_the_workers(tmp_path, flag: list[str], want: bool) -> None:
    """`heteropp run --no-zero1` is a training spec's `zero1: false`: the workers' options carry it."""
    path, out = tmp_path / "plan.json", tmp_path / "run.json"
    p = plan([(1, 4, False), (1, 4, False)], dp=2)
    p.num_layers = None
    path.write_text(json.dumps(p.to_dict()))
    assert main(["run", "--plan", str(path), "--model", "tiny", "--steps", "1", "--chip-map", "A=cpu,B=cpu",
                 *flag, "--write-config", str(out)]) == 0
    assert json.loads(out.read_text())["options"]["zero1"] is want


def test_an_elastic_run_replans_with_the_zero1_it_trains_with(tmp_path) -> None:
    """`--elastic --no-zero1`: the training spec its re-planning reads says zero1: false, so HeteroAuto prices the
    whole optimizer state and step the workers will hold."""
    from heteropp.spec.training import train_from_dict
    path, out = tmp_path / "plan.json", tmp_path / "elastic.json"
    path.write_text(json.dumps({"version": 2, "stages": [{"chip": "big", "tp": 1, "layers": 8}], "dp": 1,
                                "micro_batch_size": 1, "micro_batches": 2}))
    cluster = Path(__file__).resolve().parents[2] / "examples/clusters/two-cpu.yaml"
    assert main(["run", "--elastic", "--no-zero1", "--plan", str(path), "--model", "tiny", "--cluster", str(cluster),
                 "--checkpoint-dir", str(tmp_path / "ck"), "--write-config", str(out)]) == 0
    cfg = json.loads(out.read_text())
    assert cfg["options"]["zero1"] is False
    assert train_from_dict(cfg["elastic"]["train"]).zero1 is False


@pytest.mark.parametrize("recorded,flag,want", [(False, [], False), (True, [], True), (False, ["--zero1"], True),
                                                (True, ["--no-zero1"], False), (False, ["--no-zero1"], False)])
def test_heteropp_run_trains_with_the_plans_zero1_unless_a_flag_says_otherwise(
        tmp_path, capsys, recorded: bool, flag: list[str], want: bool) -> None:
    """A plan records the zero1 HeteroAuto priced it with; `run --plan` trains with it, and an explicit
    --zero1 / --no-zero1 wins, saying the run then differs from what was priced."""
    path, out = tmp_path / "plan.json", tmp_path / "run.json"
    p = plan([(1, 4, False), (1, 4, False)], dp=2)
    p.num_layers = None
    path.write_text(json.dumps({**p.to_dict(), "zero1": recorded}))
    assert main(["run", "--plan", str(path), "--model", "tiny", "--steps", "1", "--chip-map", "A=cpu,B=cpu",
                 *flag, "--write-config", str(out)]) == 0
    assert json.loads(out.read_text())["options"]["zero1"] is want
    err = capsys.readouterr().err
    assert ("differs from what was priced" in err) is (want != recorded), err


def test_a_plan_heteroauto_priced_without_zero1_trains_without_it(tmp_path, capsys) -> None:
    """`heteroauto plan` with a training spec's zero1: false, then `heteropp run --plan` with no flag: the
    workers hold the whole optimizer state, as the plan was priced."""
    from heteropp.auto.cli import main as heteroauto
    ex = Path(__file__).resolve().parents[2] / "examples"
    train, path, out = tmp_path / "train.yaml", tmp_path / "plan.json", tmp_path / "run.json"
    train.write_text((ex / "training" / "tiny.yaml").read_text().replace("zero1: true", "zero1: false"))
    cluster = str(ex / "clusters" / "two-cpu.yaml")
    assert heteroauto(["plan", "--cluster", cluster, "--model", "tiny", "--train", str(train), "--json", str(path),
                       "--no-progress"]) == 0
    assert main(["run", "--plan", str(path), "--model", "tiny", "--steps", "1", "--cluster", cluster,
                 "--write-config", str(out)]) == 0
    assert json.loads(out.read_text())["options"]["zero1"] is False
    assert "differs from what was priced" not in capsys.readouterr().err
