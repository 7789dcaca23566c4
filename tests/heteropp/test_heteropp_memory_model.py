"""HeteroAuto's memory model counts what the engine holds: the bytes of every tensor a stage keeps across
steps (its weights, their gradients, the optimizer's moments and masters), found by walking the live objects
and adding up their distinct storages, equal the model's static bytes for that stage, in fp32 and bf16, with
and without ZeRO-1 sharding, with TP and grouped K/V heads. (The engine used to keep a second copy of the
weights and gradients in flat buffers beside the parameters and an fp64 mask: 28-36 bytes per parameter where
the model counted 16.) The measured peaks of real runs against the model are in docs/benchmarks.md."""
from __future__ import annotations

import pytest
import torch

from heteropp.auto.analytic import analytic_profile
from heteropp.auto.costs import CostModel
from heteropp.engine.build import TORCH_DTYPES
from heteropp.engine.optim import ZeroAdamW
from heteropp.model import StageModel, TPGroup
from heteropp.spec import ModelSpec, TrainSpec
from heteropp.spec.cluster import ChipType, Cluster

MODEL = ModelSpec("mem", layers=4, hidden=64, heads=4, kv_heads=2, ffn=160, vocab=384, seq_len=16)


def _held_bytes(chunks: list[StageModel], opt: ZeroAdamW) -> int:
    """Distinct storages reachable from the parameters (weight, .grad, .main_grad) and the optimizer's tensors."""
    seen: dict[int, int] = {}

    def add(t: object) -> None:
        if isinstance(t, torch.Tensor):
            s = t.untyped_storage()
            seen[s.data_ptr()] = s.nbytes()

    for c in chunks:
        for p in c.parameters():
            for t in (p, p.grad, getattr(p, "main_grad", None)):
                add(t)
    for v in vars(opt).values():
        add(v)
    return sum(seen.values())


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("tp,dp", [(1, 1), (1, 2), (2, 1), (2, 4)])
@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_the_state_a_stage_holds_is_what_heteroauto_counts(dtype: str, tp: int, dp: int, where: str) -> None:
    first, last = where == "first", where == "last"
    layers = 2
    tpg = TPGroup(rank=0, size=tp)  # no process group: building a stage and its optimizer talks to no one
    chunk = StageModel(MODEL, range(1, 1 + layers), tpg, seed=0, first=first, last=last, recompute=False)
    chunk = chunk.to(dtype=TORCH_DTYPES[dtype])
    named = list(chunk.named_parameters())
    opt = ZeroAdamW([p for _, p in named], 1e-3, dp_rank=0, dp_size=dp, clip_norm=1.0)
    held = _held_bytes([chunk], opt)

    chip = ChipType("cpu", count=64, memory_gb=64, peak_tflops=1.0, chips_per_node=64, tp_max=4,
                    intra_node_bw=1.0, network_bw=1.0)
    train = TrainSpec(global_batch=dp, micro_batch_size=1, dtype=dtype, zero1=True)
    cluster = Cluster("local", (chip,))
    cm = CostModel(cluster, MODEL, train, analytic_profile(cluster, MODEL, train))
    c = cm.coef("cpu", tp, False, dp)
    predicted = layers * c.static
    for flag, which in ((first, "first"), (last, "last")):
        if flag:
            predicted += cm.end("cpu", tp, dp, which).static
    # ZeRO pads the flat buffers to a multiple of dp elements: a few bytes
    assert held == pytest.approx(predicted, rel=2e-3), (
        f"{dtype} tp {tp} dp {dp} {where}: the stage holds {held} bytes, the memory model counts {predicted:.0f}")
