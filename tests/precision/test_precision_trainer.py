"""The precision tools under HuggingFace's ``Trainer`` (the loop users run, with accelerate's wrapped
optimizer, gradient clipping and its own data loader): a random-weight LlamaForCausalLM trained a few
steps on the CPU is captured twice, once with a 1e-4 relative fault planted in one layer's aten::mm;
the default compare names that op, in every step, and nothing else. The reference for where the
fault is: where the test planted it."""
import json
from contextlib import nullcontext

import pytest
import torch

from ditorch_precision import Capture
from ditorch_precision.cli import main
from ditorch_precision.examples.faults import wrong_kernel
from ditorch_precision.examples.hf_llama import HFLlamaSize, hf_batches, make_hf_llama

pytest.importorskip("transformers")
pytest.importorskip("accelerate")
pytestmark = pytest.mark.usefixtures("one_thread")

SIZE = HFLlamaSize()
STEPS = 2
FAULTY = "LlamaForCausalLM.model.layers.0.mlp.down_proj"


def _trainer_run(path, out_dir, fault: bool):
    from transformers import Trainer, TrainingArguments

    model = make_hf_llama(SIZE)
    rows = [{"input_ids": ids, "labels": ids} for batch in hf_batches(SIZE, STEPS) for ids in batch]
    args = TrainingArguments(output_dir=str(out_dir), max_steps=STEPS, per_device_train_batch_size=SIZE.batch,
                             learning_rate=1e-3, use_cpu=True, report_to=[], save_strategy="no",
                             logging_strategy="no", disable_tqdm=True, seed=0, dataloader_num_workers=0)
    trainer = Trainer(model=model, args=args, train_dataset=rows)
    plant = wrong_kernel("mm", 1 + 1e-4, inside=model.model.layers[0].mlp.down_proj) if fault else nullcontext()
    with plant, Capture(str(path)):
        trainer.train()
    return str(path)


@pytest.fixture(scope="module")
def trainer_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("trainer")
    torch.set_num_threads(1)
    return _trainer_run(root / "bad", root / "out_bad", True), _trainer_run(root / "ref", root / "out_ref", False)


def test_trainer_compare_names_the_planted_mm_in_every_step_and_nothing_else(trainer_runs, capsys):
    bad, ref = trainer_runs
    assert main(["compare", bad, ref, "--json"]) == 1
    d = json.loads(capsys.readouterr().out)
    failed = [(r["op"], r["module"], r["phase"], r["step"]) for r in d["ops"] if r["status"] == "fail"]
    assert failed == [("aten::mm", FAULTY, "forward", step) for step in range(STEPS)]
    steps = {r["step"] for r in d["ops"]}
    assert steps >= set(range(STEPS)) and d["n_passed"] > 1000
    assert any(r["phase"] == "optimizer" and r["status"] == "pass" for r in d["ops"])  # the wrapped optimizer's steps


def test_two_trainer_runs_without_the_fault_compare_clean(trainer_runs, tmp_path, capsys):
    _, ref = trainer_runs
    again = _trainer_run(tmp_path / "again", tmp_path / "out", False)
    assert main(["compare", again, ref]) == 0
