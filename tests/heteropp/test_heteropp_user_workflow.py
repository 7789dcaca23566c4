"""What a user runs, through the `heteropp` command line in real processes: a tokenizer trained on local
text, a corpus prepared into a token file, a HF model directory (written by `transformers`) of that
vocabulary, a plan over two chip types trained with checkpoints, resumed, and exported; bad inputs exit 2
naming the problem."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .hf_models import write_hf_model

REPO = Path(__file__).resolve().parents[2]
transformers = pytest.importorskip("transformers")


def heteropp(*args: str, ok: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "heteropp", *args], capture_output=True, text=True, timeout=300)
    if ok:
        assert r.returncode == 0, r.stdout + r.stderr
    return r


@pytest.mark.slow
def test_prepare_train_resume_export(tmp_path) -> None:
    docs = [str(p) for p in sorted((REPO / "docs").glob("*.md"))[:4]]
    heteropp("data", "train-tokenizer", "--out", str(tmp_path / "tok"), "--vocab-size", "320", *docs)
    heteropp("data", "prepare", "--tokenizer", str(tmp_path / "tok"), "--out", str(tmp_path / "corpus.tok"), *docs)
    model = write_hf_model(tmp_path / "model", "llama", vocab_size=320)
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"version": 2, "stages": [{"chip": "A", "tp": 2, "layers": 2},
                                                         {"chip": "B", "tp": 1, "layers": 1}],
                                "dp": 1, "micro_batch_size": 1, "micro_batches": 2, "schedule": "1f1b"}))
    common = ["--model", str(model), "--data", str(tmp_path / "corpus.tok"), "--checkpoint-dir", str(tmp_path / "ck"),
              "--dtype", "bf16", "--warmup-steps", "1", "--lr-decay", "cosine"]
    run = ["run", "--plan", str(plan), "--chip-map", "A=cpu,B=cpu", "--backend", "gloo"]
    heteropp(*run, *common, "--steps", "2", "--loss-log", str(tmp_path / "a.jsonl"))
    r = heteropp(*run, *common, "--steps", "4", "--resume", "--loss-log", str(tmp_path / "a.jsonl"))
    lines = [json.loads(x) for x in (tmp_path / "a.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2, 3, 4], r.stdout
    assert all(x["lr"] >= 0 and x["tokens_per_s"] > 0 and len(x["peak_memory_gb"]) == 2 for x in lines)
    assert lines[0]["lr"] > 0 and lines[2]["lr"] > lines[3]["lr"]  # warm-up, then cosine decay
    heteropp("export", "--checkpoint", str(tmp_path / "ck"), "--out", str(tmp_path / "hf"),
             "--tokenizer", str(tmp_path / "tok"))
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    assert hf.config.vocab_size == 320 and (tmp_path / "hf" / "tokenizer.json").is_file()


def test_bad_inputs_exit_2_naming_the_problem(tmp_path) -> None:
    docs = [str(REPO / "README.md")]
    heteropp("data", "train-tokenizer", "--out", str(tmp_path / "tok"), "--vocab-size", "300", *docs)
    heteropp("data", "prepare", "--tokenizer", str(tmp_path / "tok"), "--out", str(tmp_path / "c.tok"), *docs)
    small = write_hf_model(tmp_path / "small", "llama", vocab_size=128)
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    (gpt2 / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    cases = [
        (["--model", str(small), "--data", str(tmp_path / "c.tok")], "vocab"),
        (["--model", str(gpt2)], "model_type"),
        (["--model", "tiny", "--resume"], "--checkpoint-dir"),
    ]
    for args, named in cases:
        r = heteropp("reference", "--steps", "1", *args, ok=False)
        assert r.returncode == 2 and named in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)


def test_options_that_would_be_ignored_exit_2(tmp_path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"version": 2, "stages": [{"chip": "A", "tp": 1, "layers": 8}], "dp": 1,
                                "micro_batch_size": 1, "micro_batches": 1}))
    for args, named in ((["reference", "--model", "tiny", "--checkpoint-dir", str(tmp_path), "--reset-optimizer"],
                         "--reset-optimizer"),
                        (["run", "--plan", str(plan), "--model", "tiny", "--hosts", "A:1"], "--hosts")):
        r = heteropp(*args, ok=False)
        assert r.returncode == 2 and named in r.stderr and "Traceback" not in r.stderr, r.stderr
