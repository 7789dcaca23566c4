"""The step log also goes to TensorBoard when it is installed (a test dependency): the event files beside the
JSON-lines log hold, per step, the loss, learning rate and gradient norm the run returned, read back with
TensorBoard's own reader."""
from __future__ import annotations

import json

import pytest

from heteropp.engine import train_reference
from heteropp.engine.config import TrainOptions
from heteropp.spec import ModelSpec

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


def test_the_step_log_is_readable_in_tensorboard(tmp_path) -> None:
    m = ModelSpec("tb", layers=2, hidden=32, heads=2, kv_heads=2, ffn=64, vocab=128, seq_len=8)
    log = tmp_path / "run.jsonl"
    res = train_reference(m, steps=4, sequences=2, loss_log=str(log), clip_grad=1.0, verbose=False,
                          opts=TrainOptions(warmup_steps=2))
    acc = event_accumulator.EventAccumulator(str(tmp_path / "run.tb"))
    acc.Reload()
    assert {"loss", "lr", "grad_norm", "tokens_per_s"} <= set(acc.Tags()["scalars"])
    got = {k: [(e.step, e.value) for e in acc.Scalars(k)] for k in ("loss", "lr", "grad_norm")}
    assert [s for s, _ in got["loss"]] == [1, 2, 3, 4]
    assert [v for _, v in got["loss"]] == pytest.approx(res["losses"], rel=1e-6)  # TensorBoard keeps fp32
    assert [v for _, v in got["grad_norm"]] == pytest.approx(res["grad_norms"], rel=1e-6)
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert [v for _, v in got["lr"]] == pytest.approx([x["lr"] for x in lines], rel=1e-6)
    assert got["lr"][0][1] < got["lr"][1][1]  # the warm-up shows
