"""`heteropp data ...` on the command line: a real run in its own process (train a tokenizer, prepare with
progress on stderr, info), and bad inputs exiting 2 with a message naming the problem, no traceback."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from heteropp.data.cli import add_data_commands, main
from heteropp.spec import SpecError

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "heteropp.data.cli", "data", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cli") / "tokenizer.json"
    assert main(["data", "train-tokenizer", "--vocab-size", "300", "--out", str(out), str(ROOT / "README.md")]) == 0
    return out


def test_prepare_and_info_end_to_end(tok: Path, tmp_path: Path) -> None:
    out = tmp_path / "readme.tok"
    done = _cli("prepare", "--tokenizer", tok, "--out", out, ROOT / "README.md", ROOT / "docs" / "heteropp.md")
    assert done.returncode == 0, done.stderr
    assert "heteropp data prepare:" in done.stderr and "MB read (100%)" in done.stderr, done.stderr
    assert "tokens in" in done.stdout and "uint16, vocabulary 300, eos 0" in done.stdout, done.stdout
    info = _cli("info", out, "--seq-len", "32")
    assert info.returncode == 0 and "sequences of 33 tokens per epoch" in info.stdout, info.stderr


def test_the_commands_plug_into_a_parent_parser(tok: Path, tmp_path: Path) -> None:
    """As the `heteropp` CLI wires them: each sub-command sets fn(args) -> int."""
    parser = argparse.ArgumentParser(prog="heteropp")
    add_data_commands(parser.add_subparsers(dest="command", required=True))
    a = parser.parse_args(["data", "prepare", "--tokenizer", str(tok), "--out", str(tmp_path / "o.tok"), "--quiet",
                           str(ROOT / "README.md")])
    assert a.fn(a) == 0 and (tmp_path / "o.tok").stat().st_size > 64
    with pytest.raises(SystemExit) as e:
        parser.parse_args(["data"])
    assert e.value.code == 2


def _bad(tmp_path: Path, tok: Path, case: str) -> list[str]:
    txt = tmp_path / "in.txt"
    txt.write_text("some text\n")
    out = str(tmp_path / "o.tok")
    if case == "missing input":
        return ["prepare", "--tokenizer", str(tok), "--out", out, str(tmp_path / "absent.txt")]
    if case == "directory without tokenizer.json":
        return ["prepare", "--tokenizer", str(tmp_path), "--out", out, str(txt)]
    if case == "not a tokenizer":
        return ["prepare", "--tokenizer", str(txt), "--out", out, str(txt)]
    if case == "unknown eos":
        return ["prepare", "--tokenizer", str(tok), "--out", out, "--eos", "<nope>", str(txt)]
    if case == "eos id outside the vocabulary":
        return ["prepare", "--tokenizer", str(tok), "--out", out, "--eos", "300", str(txt)]
    if case == "bad json line":
        (tmp_path / "c.jsonl").write_text('{"text": "ok"}\n{"text": \n')
        return ["prepare", "--tokenizer", str(tok), "--out", out, str(tmp_path / "c.jsonl")]
    if case == "not utf-8":
        txt.write_bytes(b"caf\xe9\n")
        return ["prepare", "--tokenizer", str(tok), "--out", out, str(txt)]
    if case == "output directory missing":
        return ["prepare", "--tokenizer", str(tok), "--out", str(tmp_path / "no" / "o.tok"), str(txt)]
    if case == "no end-of-document token":
        from tokenizers import Tokenizer, models
        Tokenizer(models.WordLevel({"a": 0, "<unk>": 1}, unk_token="<unk>")).save(str(tmp_path / "wl.json"))
        return ["prepare", "--tokenizer", str(tmp_path / "wl.json"), "--out", out, str(txt)]
    if case == "not a token file":
        return ["info", str(txt)]
    if case == "vocabulary too small":
        return ["train-tokenizer", "--vocab-size", "100", "--out", str(tmp_path / "t.json"), str(txt)]
    raise AssertionError(case)


EXPECTED = {
    "missing input": "absent.txt: field 'input': does not exist or is not a file",
    "directory without tokenizer.json": "field '--tokenizer': no tokenizer.json there",
    "not a tokenizer": "in.txt: field '--tokenizer': not a tokenizer file",
    "unknown eos": "field '--eos': token '<nope>' is not in the tokenizer's vocabulary",
    "eos id outside the vocabulary": "id 300 is outside the tokenizer's vocabulary of 300",
    "bad json line": "c.jsonl:2: field 'json': not a JSON object",
    "not utf-8": "in.txt:1: field 'text': not UTF-8",
    "output directory missing": "o.tok: field '--out': its directory does not exist",
    "no end-of-document token": "wl.json: field '--eos': the tokenizer names no end-of-document token (expected "
                                "--eos TOKEN, --eos ID or --eos none)",
    "not a token file": "in.txt: field 'header': file is 10 bytes, shorter than the 64-byte header",
    "vocabulary too small": "--vocab-size: expected an integer >= 257, got 100",
}


@pytest.mark.parametrize("case", list(EXPECTED))
def test_bad_input_exits_2_naming_the_problem(tok: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                              case: str) -> None:
    argv = ["data", *_bad(tmp_path, tok, case)]
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own errors (a bad number)
        code = int(e.code or 0)
    err = capsys.readouterr().err
    assert code == 2 and EXPECTED[case] in err and "Traceback" not in err, err
    assert not (tmp_path / "o.tok").exists()


def test_bad_input_exits_2_in_a_real_process(tmp_path: Path) -> None:
    (tmp_path / "c.jsonl").write_text(json.dumps({"body": "x"}) + "\n")
    done = _cli("prepare", "--tokenizer", tmp_path, "--out", tmp_path / "o.tok", tmp_path / "c.jsonl")
    assert done.returncode == 2 and done.stderr.startswith("heteropp: error: ") and "Traceback" not in done.stderr
    assert "no tokenizer.json there" in done.stderr, done.stderr


def test_train_tokenizer_raises_spec_error_for_no_inputs(tmp_path: Path) -> None:
    from heteropp.data.tokenizer import train_tokenizer
    with pytest.raises(SpecError, match="no input files given"):
        train_tokenizer([], tmp_path / "t.json", 300)
