"""Checkpoints (torch.distributed.checkpoint files keyed by HF names) of real multi-process runs: a run that
dies after a checkpoint and resumes continues bit for bit as if it had never stopped (fp32 and bf16, ZeRO-1
over two replicas); a checkpoint exports to a directory `transformers` loads with the same weights and logits;
a checkpoint of another model or with changed bytes is refused naming what differs."""
from __future__ import annotations

import json

import pytest
import torch

from heteropp.engine import RunConfig, launch, train_reference
from heteropp.engine.checkpoint import complete_checkpoints
from heteropp.engine.config import TrainOptions
from heteropp.engine.export import export_hf
from heteropp.plan import Plan, StagePlan
from heteropp.spec import ModelSpec, SpecError

MODEL = ModelSpec("ckpt", layers=3, hidden=32, heads=4, kv_heads=2, ffn=64, vocab=96, seq_len=16)
# two pipelines over two chip types; ZeRO-1 shards each stage's optimizer state over its 2 replicas
PLAN = Plan([StagePlan("A", 1, 2), StagePlan("B", 1, 1)], dp=2, micro_batch_size=1, micro_batches=2, num_layers=3)
STEPS = 6


def _run(tmp_path, name: str, **kw) -> list[float]:
    log = tmp_path / f"{name}.jsonl"
    options = {"checkpoint_dir": str(tmp_path / name), "save_every": 3, "warmup_steps": 2, "lr_decay": "cosine",
               "min_lr": 1e-4, **kw.pop("options", {})}
    cfg = RunConfig(plan=PLAN.to_dict(), model=RunConfig.model_dict(MODEL), steps=STEPS, backend="gloo",
                    chip_map={"A": "cpu", "B": "cpu"}, timeout_s=60, loss_log=str(log), options=options, **kw)
    try:
        launch(cfg)
    except Exception:
        if cfg.fail_rank < 0:
            raise
    return [json.loads(line)["loss"] for line in log.read_text().splitlines()]


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_a_run_that_died_resumes_bit_for_bit(tmp_path, dtype) -> None:
    whole = _run(tmp_path, "whole", options={"dtype": dtype})
    # the same run, dying at step 5 (after the step-3 checkpoint), then resumed
    opts = {"dtype": dtype, "async_save": False}
    _run(tmp_path, "broken", fail_rank=1, fail_step=5, options=opts)
    assert [p.name for p in complete_checkpoints(tmp_path / "broken")] == ["step-00000003"]
    resumed = _run(tmp_path, "broken", options={**opts, "resume": True})
    assert len(resumed) == STEPS
    assert resumed == whole  # value for value
    assert len(set(whole)) == STEPS


def test_a_checkpoint_exports_to_a_directory_transformers_loads(tmp_path) -> None:
    transformers = pytest.importorskip("transformers")
    opts = TrainOptions(checkpoint_dir=str(tmp_path / "ck"))
    r = train_reference(MODEL, 2, 4, verbose=False, collect_params=True, opts=opts)
    out = export_hf(tmp_path / "ck", tmp_path / "hf")
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    hp = dict(hf.named_parameters())
    torch.testing.assert_close(hp["model.layers.1.self_attn.k_proj.weight"], r["params"]["layers.1.attn.wk.weight"],
                               rtol=0, atol=0)
    torch.testing.assert_close(hp["lm_head.weight"], r["params"]["head.weight"], rtol=0, atol=0)
    # resumed from its checkpoint, our model computes what transformers computes from the export
    from heteropp.model import StageModel, TPGroup
    from heteropp.model.hf_weights import load_hf_weights
    ours = StageModel(MODEL, range(3), TPGroup(), seed=5, first=True, last=True)
    load_hf_weights([ours], MODEL, out, 0, 1)
    ids = torch.randint(0, MODEL.vocab, (2, MODEL.seq_len))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf(ids).logits, rtol=2e-5, atol=2e-5)


def test_a_checkpoint_of_another_model_or_with_changed_bytes_is_refused(tmp_path) -> None:
    train_reference(MODEL, 1, 2, verbose=False, opts=TrainOptions(checkpoint_dir=str(tmp_path / "ck")))
    other = ModelSpec("ckpt", layers=3, hidden=32, heads=4, kv_heads=2, ffn=32, vocab=96, seq_len=16)
    with pytest.raises(SpecError, match=r"model\.ffn.*ffn=64"):
        train_reference(other, 2, 2, verbose=False, opts=TrainOptions(checkpoint_dir=str(tmp_path / "ck"), resume=True))
    shard = next((tmp_path / "ck" / "step-00000001").glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(SpecError, match=r"distcp.*bytes changed"):
        train_reference(MODEL, 2, 2, verbose=False, opts=TrainOptions(checkpoint_dir=str(tmp_path / "ck"), resume=True))


@pytest.mark.slow
def test_a_rank_killed_while_a_checkpoint_is_written_leaves_the_previous_one(tmp_path) -> None:
    whole = _run(tmp_path, "whole", options={"save_every": 1})
    # saves after every step; the step-2 checkpoint is still being written (in the background) when rank 2
    # is SIGKILLed at the start of step 3, so it is never completed
    _run(tmp_path, "broken", fail_rank=2, fail_step=3, fail_kill=True, options={"save_every": 1})
    assert [p.name for p in complete_checkpoints(tmp_path / "broken")] == ["step-00000001"]
    assert (tmp_path / "broken" / "step-00000002.partial").is_dir()
    resumed = _run(tmp_path, "broken", options={"save_every": 1, "resume": True})
    assert resumed == whole


def test_export_keeps_the_models_own_config(tmp_path) -> None:
    """A run that started from a HF directory exports its config back: token ids and max_position_embeddings
    (not the training sequence length) kept, the architecture as trained."""
    from .hf_models import write_hf_model
    transformers = pytest.importorskip("transformers")
    d = write_hf_model(tmp_path / "m", "llama", bos_token_id=1, eos_token_id=2, max_position_embeddings=32)
    import subprocess
    import sys
    base = [sys.executable, "-m", "heteropp"]
    r = subprocess.run([*base, "reference", "--model", str(d), "--seq-len", "16", "--steps", "1", "--global-batch", "2",
                        "--checkpoint-dir", str(tmp_path / "ck")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([*base, "export", "--checkpoint", str(tmp_path / "ck"), "--out", str(tmp_path / "hf")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "Warning" not in r.stderr, r.stderr
    cfg = transformers.AutoConfig.from_pretrained(tmp_path / "hf")
    assert (cfg.max_position_embeddings, cfg.bos_token_id, cfg.eos_token_id) == (32, 1, 2)
    # a resumed run already at its last step says so without starting
    r = subprocess.run([*base, "reference", "--model", str(d), "--seq-len", "16", "--steps", "1", "--global-batch", "2",
                        "--checkpoint-dir", str(tmp_path / "ck"), "--resume"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and "nothing to do: the checkpoint is already at step 1 of 1" in r.stdout
