"""HeteroAuto's memory model counts what the engine holds: the bytes of every tensor a stage keeps across steps
(its weights, their gradients, the optimizer's moments and masters), found by walking the live objects and
adding up their distinct storages, equal the model's static bytes for that stage, in fp32 and bf16, with and
without ZeRO-1 sharding (`zero1: false`: every DP rank holds the whole state), with TP and grouped K/V heads.
(The engine used to keep a second copy of the weights and gradients in flat buffers beside the parameters and
an fp64 mask: 28-36 bytes per parameter where the model counted 16.) The measured peaks of real runs against
the model are in docs/benchmarks.md."""
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
@pytest.mark.parametrize("zero1", [True, False])
def test_the_state_a_stage_holds_is_what_heteroauto_counts(dtype: str, tp: int, dp: int, where: str,
                                                           zero1: bool) -> None:
    first, last = where == "first", where == "last"
    layers = 2
    tpg = TPGroup(rank=0, size=tp)  # no process group: building a stage and its optimizer talks to no one
    chunk = StageModel(MODEL, range(1, 1 + layers), tpg, seed=0, first=first, last=last, recompute=False)
    chunk = chunk.to(dtype=TORCH_DTYPES[dtype])
    named = list(chunk.named_parameters())
    opt = ZeroAdamW([p for _, p in named], 1e-3, dp_rank=0, dp_size=dp, clip_norm=1.0, zero1=zero1)
    held = _held_bytes([chunk], opt)

    chip = ChipType("cpu", count=64, memory_gb=64, peak_tflops=1.0, chips_per_node=64, tp_max=4,
                    intra_node_bw=1.0, network_bw=1.0)
    train = TrainSpec(global_batch=dp, micro_batch_size=1, dtype=dtype, zero1=zero1)
    cluster = Cluster("local", (chip,))
    cm = CostModel(cluster, MODEL, train, analytic_profile(cluster, MODEL, train))
    c = cm.coef("cpu", tp, False, dp)
    predicted = layers * c.static
    for flag, which in ((first, "first"), (last, "last")):
        if flag:
            predicted += cm.end("cpu", tp, dp, which).static
    # ZeRO pads the flat buffers to a multiple of dp elements: a few bytes
    assert held == pytest.approx(predicted, rel=2e-3), (
        f"{dtype} tp {tp} dp {dp} zero1 {zero1} {where}: the stage holds {held} bytes, "
        f"the memory model counts {predicted:.0f}")


def _saved_bytes(chunk: StageModel, x: torch.Tensor) -> int:
    """Bytes of the distinct storages autograd keeps for backward over one forward of `chunk`: activations
    only (parameters and constants, leaves that need no gradient, apart)."""
    params = {p.untyped_storage().data_ptr() for p in chunk.parameters()}
    kept: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in params and not (t.is_leaf and not t.requires_grad):
            kept[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = chunk(x)
    del y
    return sum(kept.values())


SAVED_MODELS = {
    "gqa": ModelSpec("gqa", layers=4, hidden=128, heads=8, kv_heads=2, ffn=344, vocab=512, seq_len=32),
    "mha-bias": ModelSpec("mha", layers=4, hidden=128, heads=4, kv_heads=4, ffn=256, vocab=512, seq_len=32,
                          qkv_bias=True),
}


@pytest.mark.parametrize("recompute", [False, True])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("name", sorted(SAVED_MODELS))
def test_what_a_layer_keeps_for_backward_is_what_heteroauto_counts(name: str, dtype: str, recompute: bool) -> None:
    """A layer's activations kept for backward (found by torch's saved-tensor hooks) equal the memory model's
    activation bytes (checkpoint bytes under recompute) within the few bytes per row the model leaves out
    (the attention's log-sum-exp, the norms' scales). The engine used to keep 46% more (fp32, 63% in bf16):
    the norms' fp32 rows and outputs, expanded key/value heads, a reshaped copy of the attention output and
    silu(gate), all of which autograd's own graph of those operations keeps."""
    m = SAVED_MODELS[name]
    torch_dtype = TORCH_DTYPES[dtype]
    layers = 2
    chunk = StageModel(m, range(1, 1 + layers), TPGroup(rank=0, size=1), seed=0, first=False, last=False,
                       recompute=recompute).to(dtype=torch_dtype)
    x = torch.randn(2, m.seq_len, m.hidden, dtype=torch_dtype, requires_grad=True)
    _saved_bytes(chunk, x)  # once first: the rotary angles are computed and cached for every later forward
    kept = _saved_bytes(chunk, x)
    tokens, nb = 2 * m.seq_len, torch_dtype.itemsize
    per_layer = (m.checkpoint_bytes if recompute else m.activation_bytes)(tokens, 1, nb)
    assert kept == pytest.approx(layers * per_layer, rel=0.01), (
        f"{name} {dtype} recompute={recompute}: {layers} layers keep {kept} bytes for backward, the memory model "
        f"counts {layers * per_layer:.0f}")
