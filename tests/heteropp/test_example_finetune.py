"""examples/finetune/README.md run as written: its ```sh blocks, command by command, in a copy of the folder
next to a copy of docs/, through bash and the installed `heteropp` / `heteroauto` / `python`. Each `#>` line
must match a line the command prints (`...` matches anything); the block marked with Ctrl-C is interrupted
with SIGINT to its process group, as a terminal does, once a checkpoint is complete. Then transformers,
reading the token file's documented layout on its own, says the exported model is the trained one: its
loss on the corpus is well below the starting model's."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from .long_tests import long_test

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "finetune"
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@dataclass
class Command:
    line: str
    expect: list[str] = field(default_factory=list)
    interrupt: bool = False


def readme_commands(text: str) -> list[Command]:
    """The commands of the ```sh blocks: backslash-continued lines joined, `#>` lines the expected output
    of the command above them, a comment naming Ctrl-C marks that command for interruption."""
    cmds: list[Command] = []
    for block in re.findall(r"^```sh\n(.*?)^```", text, re.S | re.M):
        for raw in block.replace("\\\n", " ").splitlines():
            line = raw.strip()
            if line.startswith("#>"):
                cmds[-1].expect.append(line[2:].strip())
            elif line.startswith("#"):
                if "Ctrl-C" in line:
                    cmds[-1].interrupt = True
            elif line:
                cmds.append(Command(" ".join(line.split())))
    return cmds


def matches(expected: str, output: str) -> bool:
    pattern = ".*".join(re.escape(part) for part in expected.split("..."))
    return any(re.fullmatch(pattern, line.strip()) for line in output.splitlines())


def complete_checkpoints(directory: Path) -> list[int]:
    # step-NNNNNNNN/ appears by rename once every file of it is written (step-NNNNNNNN.partial/ until then)
    if not directory.is_dir():
        return []
    return sorted(int(p.name[5:]) for p in directory.glob("step-*") if p.name[5:].isdigit())


def corpus_windows(path: Path, seq_len: int, count: int) -> torch.Tensor:
    """`count` windows of seq_len + 1 tokens spread over the token file, read by its format's header
    (docs/heteropp-data.md: magic, version, bytes per token, vocabulary, eos, token count at offset 32)."""
    raw = path.read_bytes()
    assert raw[:8] == b"HPPTOKEN"
    itemsize = int.from_bytes(raw[12:16], "little")
    n = int.from_bytes(raw[32:40], "little")
    tokens = np.frombuffer(raw, dtype={2: "<u2", 4: "<u4"}[itemsize], count=n, offset=64).astype(np.int64)
    starts = np.linspace(0, n - seq_len - 2, count).astype(np.int64)
    return torch.from_numpy(np.stack([tokens[s:s + seq_len + 1] for s in starts]))


def lm_loss(model_dir: Path, windows: torch.Tensor) -> float:
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return float(model(windows, labels=windows).loss)  # transformers shifts the labels itself


@long_test("~30 s on 2 cores")
def test_finetune_walkthrough_as_written(tmp_path) -> None:
    cmds = readme_commands((EXAMPLE / "README.md").read_text())
    # the walk-through's stages are all there: a README that drops one fails here, not silently
    assert sum(c.interrupt for c in cmds) == 1, [c.line for c in cmds]
    for part in ("train-tokenizer", "data prepare", "make_model.py", "heteroauto plan", "--resume",
                 "heteropp export", "generate.py"):
        assert any(part in c.line for c in cmds), part
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    for doc in (REPO / "docs").glob("*.md"):
        shutil.copy(doc, root / "docs")
    shutil.copytree(EXAMPLE, root / "examples" / "finetune", ignore=shutil.ignore_patterns("out", "__pycache__"))
    # `python`, `heteropp` and `heteroauto` of this interpreter's environment, as an activated venv has them
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    cwd, stopped_at, resumed_from = root, None, None
    for c in cmds:
        if c.line.startswith("cd "):
            cwd = cwd / c.line[3:]
            assert cwd.is_dir(), c.line
            continue
        if c.interrupt:
            ckpt = cwd / re.search(r"--checkpoint-dir (\S+)", c.line).group(1)
            log = tmp_path / "interrupted.out"
            with open(log, "w") as out:
                p = subprocess.Popen(["bash", "-c", c.line], cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                     start_new_session=True)
                deadline = time.monotonic() + 240
                while p.poll() is None and not complete_checkpoints(ckpt) and time.monotonic() < deadline:
                    time.sleep(0.02)
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole foreground group
                rc = p.wait(timeout=120)
            output = log.read_text()
            assert rc != 0 and complete_checkpoints(ckpt), f"{c.line}: not stopped after a checkpoint\n{output}"
            stopped_at = complete_checkpoints(ckpt)[-1]
        else:
            r = subprocess.run(["bash", "-c", c.line], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
            output = r.stdout
            assert r.returncode == 0, f"{c.line}\n{r.stdout}{r.stderr}"
            if "--resume" in c.line:
                resumed_from = int(re.search(r"\] step +(\d+) ", output).group(1))
        for expected in c.expect:
            assert matches(expected, output), f"{c.line}: no line like {expected!r} in\n{output}"

    out = cwd / "out"
    # resumed after the newest checkpoint the stopped run completed, and the log holds every step once
    assert stopped_at is not None and resumed_from == stopped_at + 1, (stopped_at, resumed_from)
    steps = [json.loads(x)["step"] for x in (out / "loss.jsonl").read_text().splitlines()]
    assert steps == list(range(1, steps[-1] + 1)) and steps[-1] > resumed_from, steps
    windows = corpus_windows(out / "docs.tok", 64, 32)
    before, after = lm_loss(out / "model", windows), lm_loss(out / "hf", windows)
    assert after < before - 0.3, (before, after)
