"""A user's HuggingFace model trained by heteropp plans: real processes (one per chip; CPU tensors and gloo
stand in for two chip types), the weights read from the safetensors `transformers` wrote, compared with
`transformers` itself trained by torch.optim.AdamW on the same batches (fp32 CPU)."""
from __future__ import annotations

import pytest
import torch

from heteropp.engine import RunConfig, launch
from heteropp.engine.data import global_batch
from heteropp.plan import Plan, StagePlan
from heteropp.spec import load_model

from .hf_models import write_hf_model

transformers = pytest.importorskip("transformers")

STEPS, LR, WD = 20, 3e-3, 0.01


def _transformers_curve(directory, sequences: int) -> list[float]:
    """The independent reference: transformers' model, torch's AdamW (no decay on 1-D tensors), the same data."""
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, attn_implementation="eager").train()
    m = load_model(directory)
    decay = [p for p in model.parameters() if p.ndim > 1]
    rest = [p for p in model.parameters() if p.ndim <= 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD}, {"params": rest, "weight_decay": 0.0}], lr=LR,
                            betas=(0.9, 0.95), eps=1e-8, foreach=False)
    losses = []
    for step in range(1, STEPS + 1):
        batch = global_batch(m, 0, step, sequences)
        logits = model(batch[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, m.vocab).float(), batch[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _ours(directory, plan: Plan) -> list[float]:
    m = load_model(directory)
    cfg = RunConfig(plan=plan.to_dict(), model=RunConfig.model_dict(m), steps=STEPS, lr=LR, backend="gloo",
                    chip_map={"A": "cpu", "B": "cpu"}, timeout_s=120, options={"init_from": str(directory)})
    res = launch(cfg)
    return next(r[plan.schedule]["losses"] for r in res.values() if r[plan.schedule]["losses"])


@pytest.mark.parametrize("kind,stages,mbs,micro_batches", [
    # TP 2 -> 1 -> 2 over two chip types (GQA, rope base 5e5)
    ("llama", [("A", 2, 1, 1), ("B", 1, 1, 1), ("A", 2, 1, 1)], 1, 4),
    # per-stage DP (the middle stage splits every micro-batch over 2 replicas), q/k/v biases and an output
    # head tied to the embedding across stages
    ("qwen2", [("A", 1, 1, 1), ("B", 1, 1, 2), ("A", 1, 1, 1)], 2, 2),
])
def test_a_plan_trains_a_hf_model_as_transformers_does(tmp_path, kind, stages, mbs, micro_batches) -> None:
    d = write_hf_model(tmp_path / kind, kind)
    plan = Plan([StagePlan(c, tp, n, inner_dp=i) for c, tp, n, i in stages], dp=1, micro_batch_size=mbs,
                micro_batches=micro_batches, num_layers=3)
    want = _transformers_curve(d, plan.global_batch)
    got = _ours(d, plan)
    assert abs(got[0] - want[0]) <= 2e-6 * abs(want[0])  # step 1: the same weights and batch
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=2e-4, atol=0)
    assert want[-1] < want[0] - 0.3  # it learned something, so the curves say something
