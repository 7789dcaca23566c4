"""A checkpoint loads onto any plan: saved by one plan (real processes; CPU tensors and gloo stand in for
two chip types), resumed by a plan that differs in everything (stage count, layer split, TP sizes, per-stage
DP, chip types, ZeRO-1 sharding, schedule) and by one process (`heteropp reference --resume`): the two
resumed loss curves agree within fp32 rounding, and both differ from a run whose Adam moments were reset,
so the optimizer state did travel."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

from heteropp.engine import RunConfig, launch, train_reference
from heteropp.engine.config import TrainOptions
from heteropp.plan import Plan, StagePlan
from heteropp.spec import ModelSpec

MODEL = ModelSpec("reshard", layers=4, hidden=32, heads=4, kv_heads=2, ffn=64, vocab=128, seq_len=16,
                  tie_embeddings=True)
SAVE, STEPS = 3, 6
A = Plan([StagePlan("A", 2, 3), StagePlan("B", 1, 1)], dp=2, micro_batch_size=1, micro_batches=2, num_layers=4)
B = Plan([StagePlan("B", 1, 1), StagePlan("A", 1, 2, inner_dp=2), StagePlan("B", 2, 1)], dp=1, micro_batch_size=2,
         micro_batches=2, num_layers=4, schedule="gpipe")


def _launch(plan: Plan, steps: int, log, **options) -> list[float]:
    cfg = RunConfig(plan=plan.to_dict(), model=RunConfig.model_dict(MODEL), steps=steps, backend="gloo",
                    chip_map={"A": "cpu", "B": "cpu"}, timeout_s=60, loss_log=str(log),
                    options={"warmup_steps": 1, "lr_decay": "linear", **options})
    launch(cfg)
    return [json.loads(x)["loss"] for x in log.read_text().splitlines()]


@pytest.mark.slow
def test_a_checkpoint_of_one_plan_resumes_on_another_and_in_one_process(tmp_path) -> None:
    assert A.global_batch == B.global_batch == 4
    ck = tmp_path / "ck"
    _launch(A, SAVE, tmp_path / "a.jsonl", checkpoint_dir=str(ck))
    shutil.copytree(ck, tmp_path / "ck-ref")
    shutil.copytree(ck, tmp_path / "ck-fresh")  # each resumed run saves its own last step
    on_b = _launch(B, STEPS, tmp_path / "b.jsonl", checkpoint_dir=str(ck), resume=True)  # steps 4..6
    one = train_reference(MODEL, STEPS, 4, verbose=False,
                          opts=TrainOptions(warmup_steps=1, lr_decay="linear",
                                            checkpoint_dir=str(tmp_path / "ck-ref"), resume=True))
    assert one["start_step"] == SAVE and len(one["losses"]) == STEPS - SAVE
    torch.testing.assert_close(torch.tensor(on_b), torch.tensor(one["losses"]), rtol=1e-5, atol=0)
    # the moments matter: the same weights with fresh Adam state give another curve
    fresh = train_reference(MODEL, STEPS, 4, verbose=False,
                            opts=TrainOptions(warmup_steps=1, lr_decay="linear",
                                              checkpoint_dir=str(tmp_path / "ck-fresh"), resume=True,
                                              reset_optimizer=True))
    assert abs(fresh["losses"][1] - one["losses"][1]) > 1e-3
