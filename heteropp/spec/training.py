"""Training spec: global batch, micro-batch size, dtype, ZeRO-1, schedule."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..schedules.registry import REGISTRY
from .io import Fields, load_mapping

# The registered schedules the planner can plan for: parameter-free ones, and those it searches as another
# (H-1F1B and interleaved 1F1B, whose parameters the plan then derives: heteropp/auto/planning.py).
SCHEDULES = tuple(n for n, k in REGISTRY.items() if not k.params or k.searched_as)
DTYPES = {"bf16": 2, "fp16": 2, "fp32": 4}
# sequences per iteration (and per micro-batch): ~1 million; the planner and the simulator work per
# micro-batch, and 1e12 ran them out of memory with a traceback. Tokens: that many sequences of 1M tokens.
MAX_GLOBAL_BATCH = 1 << 20
MAX_GLOBAL_BATCH_TOKENS = 1 << 40


@dataclass(frozen=True)
class TrainSpec:
    global_batch: int  # sequences
    micro_batch_size: int = 1
    dtype: str = "bf16"
    zero1: bool = True
    schedule: str = "1f1b"
    sequence_parallel: bool = False

    @property
    def bytes_per_value(self) -> int:
        return DTYPES[self.dtype]

    @property
    def micro_batches_total(self) -> int:
        """Micro-batches per iteration summed over all data-parallel replicas."""
        return self.global_batch // self.micro_batch_size


def train_from_dict(data: dict[str, Any], source: str = "<training>", seq_len: int | None = None) -> TrainSpec:
    """`global_batch` in sequences, or `global_batch_tokens` (needs the model's sequence length)."""
    f = Fields(data, source)
    f.unknown(
        {"global_batch", "global_batch_tokens", "micro_batch_size", "dtype", "zero1", "schedule", "sequence_parallel"}
    )
    if ("global_batch" in data) == ("global_batch_tokens" in data):
        raise f.err(
            "global_batch", "give exactly one of global_batch (sequences) and global_batch_tokens", "one of them"
        )
    if "global_batch" in data:
        gb = f.int("global_batch", max=MAX_GLOBAL_BATCH)
    else:
        tokens = f.int("global_batch_tokens", max=MAX_GLOBAL_BATCH_TOKENS)
        if seq_len is None:
            raise f.err("global_batch_tokens", "needs the model's sequence length", "global_batch in sequences")
        if tokens % seq_len:
            raise f.err("global_batch_tokens", f"{tokens} tokens is not a whole number of {seq_len}-token sequences",
                        f"a multiple of {seq_len}")
        gb = tokens // seq_len
        if gb > MAX_GLOBAL_BATCH:
            raise f.err("global_batch_tokens", f"{tokens} tokens is {gb} sequences of {seq_len} tokens",
                        f"at most {MAX_GLOBAL_BATCH} sequences")
    mbs = f.int("micro_batch_size", 1, max=MAX_GLOBAL_BATCH)
    if gb % mbs:
        raise f.err("micro_batch_size", f"global batch {gb} not divisible by {mbs}", "a divisor of the global batch")
    return TrainSpec(global_batch=gb, micro_batch_size=mbs, dtype=f.str("dtype", "bf16", choices=tuple(DTYPES)),
                     zero1=f.bool("zero1", True), schedule=f.str("schedule", "1f1b", choices=SCHEDULES),
                     sequence_parallel=f.bool("sequence_parallel", False))


def load_train(path: str | Path, seq_len: int | None = None) -> TrainSpec:
    return train_from_dict(load_mapping(path), str(path), seq_len)
