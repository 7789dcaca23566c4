"""The device-against-CPU compare of one HuggingFace model: the same seeded LLaMA, data and AdamW steps,
captured once on a device (``cuda``, or ``device`` after ``import ditorch``) and once on the CPU. Then
``precision-diff compare`` replays every op of both runs in float64 on the CPU and reports the first op
whose device error exceeds the CPU's.

    python -m ditorch_precision.examples.gpu_vs_cpu cuda cap-cuda
    python -m ditorch_precision.examples.gpu_vs_cpu cpu cap-cpu
    precision-diff compare cap-cuda cap-cpu --html gpu_vs_cpu.html

Needs ``transformers`` (the ``test`` extra).
"""
from __future__ import annotations

import argparse

import torch

from ditorch_precision import Capture
from ditorch_precision.arguments import cli_type, positive_int
from ditorch_precision.examples.hf_llama import HFLlamaSize, hf_batches, hf_train_step, make_hf_llama

SIZE = HFLlamaSize(vocab=512, hidden=256, intermediate=688, layers=2, heads=8, kv_heads=8, seq=128, batch=4)


def capture(device: str, out: str, steps: int = 3, attn: str = "eager", hook: str = "auto") -> list[float]:
    """Trains ``steps`` AdamW steps of the seeded model on ``device`` under a full capture into ``out``;
    returns the losses. The weights are made on the CPU and moved, so both devices start from the same ones."""
    if device == "device":
        import ditorch  # noqa: F401  (registers the vendor's device under the one name)
    model = make_hf_llama(SIZE, attn=attn).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with Capture(out, bulk=True, max_bytes=None, hook=hook):
        return [hf_train_step(model, opt, ids.to(device)).item() for ids in hf_batches(SIZE, steps)]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("device", help="cuda, cpu, or device (the vendor ditorch finds)")
    ap.add_argument("out", help="the capture's directory")
    ap.add_argument("--steps", type=cli_type(positive_int), default=3)
    ap.add_argument("--attn", choices=["eager", "sdpa"], default="eager")
    ap.add_argument("--hook", choices=["auto", "cpp", "python"], default="auto")
    args = ap.parse_args(argv)
    losses = capture(args.device, args.out, args.steps, args.attn, args.hook)
    print(f"{args.device}: losses {' '.join(f'{x:.6f}' for x in losses)}")


if __name__ == "__main__":
    main()
