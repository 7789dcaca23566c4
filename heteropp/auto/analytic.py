"""Analytic profile from chip specs: FLOPs and bytes per layer and one achievable-efficiency figure per chip,
so that clusters of chips nobody here has can be planned."""
from __future__ import annotations

from ..spec import Cluster, ModelSpec, TrainSpec
from .profiles import ChipProfile, Profile, TPProfile


def ring_allreduce_s(nbytes: float, n: int, bw_gbs: float) -> float:
    return 0.0 if n <= 1 else 2.0 * (n - 1) / n * nbytes / (bw_gbs * 1e9)


def ring_allgather_s(nbytes: float, n: int, bw_gbs: float) -> float:
    """A ring all-gather of `nbytes` in all (each of the n ranks contributes nbytes / n)."""
    return 0.0 if n <= 1 else (n - 1) / n * nbytes / (bw_gbs * 1e9)


def tp_profile(model: ModelSpec, train: TrainSpec, peak_tflops: float, efficiency: float, intra_bw: float,
               hbm_bw: float, tp: int) -> TPProfile:
    tokens = train.micro_batch_size * model.seq_len
    flops_s = peak_tflops * 1e12 * efficiency * tp
    nb = train.bytes_per_value
    fwd_compute = model.layer_flops_fwd(tokens, tp) / flops_s  # with each replicated K/V head projected per rank
    # Megatron TP: one all-reduce after attention and one after the MLP, in forward and again in backward.
    ar = ring_allreduce_s(nb * tokens * model.hidden, tp, intra_bw)
    fwd = fwd_compute + 2 * ar
    bwd = 2 * fwd_compute + 2 * ar
    head_f = model.head_flops_fwd(tokens) / flops_s
    # Adam on the shard: read/write fp32 master, two moments, bf16 param and grad (~36 bytes per parameter).
    optim = 36.0 * model.layer_params_tp_group(tp) / tp / (hbm_bw * 1e9)
    return TPProfile(
        fwd_s=fwd, bwd_s=bwd, recompute_s=fwd, wgrad_s=fwd_compute,
        act_bytes=model.activation_bytes(tokens, tp, nb, train.sequence_parallel),
        ckpt_bytes=model.checkpoint_bytes(tokens, tp, nb, train.sequence_parallel),
        optim_s=optim, embed_s=0.0, head_s=3 * head_f + ar,
        head_act_bytes=tokens * model.vocab / tp * (nb + 4))


def analytic_profile(cluster: Cluster, model: ModelSpec, train: TrainSpec,
                     efficiency: dict[str, float] | None = None) -> Profile:
    chips = {}
    for c in cluster.chips:
        eff = (efficiency or {}).get(c.name, c.efficiency)
        tps, t = {}, 1
        while t <= c.tp_max:
            tps[t] = tp_profile(model, train, c.peak_tflops, eff, c.intra_node_bw, c.hbm_bw, t)
            t *= 2
        chips[c.name] = ChipProfile(tps)
    return Profile(
        model=model.name,
        micro_batch_size=train.micro_batch_size,
        seq_len=model.seq_len,
        layer_params=model.layer_params,
        embed_params=model.embed_params,
        head_params=model.head_params,
        chips=chips,
        source="analytic",
        meta={"efficiency": {c.name: (efficiency or {}).get(c.name, c.efficiency) for c in cluster.chips}},
    )
