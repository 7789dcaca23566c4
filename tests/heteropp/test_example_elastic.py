"""examples/elastic/README.md run as written: its first ```sh block as one bash script (it starts the run in the
background, kills a host, starts it again and waits), in a copy of the folder, through the installed `heteroauto`
/ `heteropp` / `python`; every `#>` line must match a line of the output, in order (`...` matches anything).
Then, from the run's own files and from outside it: the killed host's processes are gone, the rounds held the
chips the walk-through says (the returned host absorbed in round 3), the resume lost at most one checkpoint
interval, every step is in the loss log and the curve follows the single-process reference within the paper's MRE
of 1.5%. The multi-host block's printed command is parsed by torchrun's own argument parser."""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path


from heteropp.engine.elastic_launch import kill_host
from .long_tests import long_test

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "elastic"


def blocks(text: str) -> list[tuple[list[str], list[str]]]:
    """Each ```sh block: its commands (backslash-continued lines joined) and its `#>` lines, in order."""
    out = []
    for block in re.findall(r"^```sh\n(.*?)^```", text, re.S | re.M):
        cmds, expect = [], []
        for raw in block.replace("\\\n", " ").splitlines():
            line = raw.strip()
            if line.startswith("#>"):
                expect.append(raw.split("#>", 1)[1].strip())
            elif line and not line.startswith("#"):
                cmds.append(line)
        out.append((cmds, expect))
    return out


def match_in_order(expect: list[str], output: str) -> None:
    lines, at = [x.strip() for x in output.splitlines()], 0
    for e in expect:
        pattern = re.compile(".*".join(re.escape(part) for part in e.split("...")))
        while at < len(lines) and not pattern.fullmatch(lines[at]):
            at += 1
        assert at < len(lines), f"no line like {e!r} (in order) in\n{output}"
        at += 1


def group_members(pgid: int) -> list[int]:
    """The processes of a process group (the script's shell and what it started in the background)."""
    out = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and int((d / "stat").read_text().rsplit(")", 1)[1].split()[2]) == pgid:
                out.append(int(d.name))
        except (OSError, ValueError):
            pass
    return out


def jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def lenient(path: Path) -> list[dict]:
    out = []
    for x in path.read_text().splitlines():
        try:
            out.append(json.loads(x))
        except json.JSONDecodeError:
            pass
    return out


@long_test("~1 min on 2 cores")
def test_elastic_walkthrough_as_written(tmp_path) -> None:
    (walk, walk_expect), (multi, multi_expect) = blocks((EXAMPLE / "README.md").read_text())
    # the walk-through's stages are all there: a README that drops one fails here, not silently
    for part in ("heteroauto plan", "heteropp run --elastic", "hosts.py kill", "hosts.py command", "small-host.sh",
                 "wait"):
        assert any(part in c for c in walk), part
    root = tmp_path / "repo"
    shutil.copytree(EXAMPLE, root / "examples" / "elastic", ignore=shutil.ignore_patterns("out", "__pycache__"))
    shutil.copytree(REPO / "examples" / "clusters", root / "examples" / "clusters")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    script = "set -e\n" + "\n".join(walk) + "\n"
    p = subprocess.Popen(["bash", "-c", script], cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True)
    try:
        stdout, stderr = p.communicate(timeout=400)
    finally:  # a failed step leaves the background run and the hosts (sessions of their own): take them down
        for pid in group_members(p.pid):
            kill_host(pid)
        p.wait()
    out = root / "examples" / "elastic" / "out"
    log = (out / "run.log").read_text() if (out / "run.log").exists() else ""
    assert p.returncode == 0, f"{stdout}{stderr}\n--- run.log\n{log[-3000:]}"
    match_in_order(walk_expect, stdout)

    # the multi-host recipe: the command it prints is one torchrun (its own parser) accepts once filled in
    (cmd,) = multi
    r = subprocess.run(["bash", "-c", cmd], cwd=root / "examples" / "elastic", env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    match_in_order(multi_expect, r.stdout)
    line = r.stdout.splitlines()[-1]
    filled = (line.replace("<CHIP>", "small").replace("<N>", "2").replace("<ADDR>:<PORT>", "10.0.0.1:29400")
              .replace("<RUN_ID>", "demo"))
    argv = [a for a in shlex.split(filled) if "=" not in a or a.startswith("-")]
    start = argv.index("torch.distributed.run") + 1
    from torch.distributed.run import get_args_parser
    args = get_args_parser().parse_args(argv[start:])
    assert (args.nnodes, args.nproc_per_node, args.rdzv_backend, args.rdzv_endpoint, args.module) == \
        ("1:2", "2", "c10d", "10.0.0.1:29400", True)
    assert args.training_script == "heteropp.engine.elastic"
    assert args.training_script_args == ["--config", "out/run.json", "--chip", "small"]
    config = json.loads((root / "examples" / "elastic" / "out" / "run.json").read_text())
    assert config["steps"] == 60 and set(config["elastic"]["cluster"]) >= {"chips"}

    events = jsonl(out / "ck" / "elastic.jsonl")
    hosts = [e for e in events if e["event"] == "host_started"]
    rounds = [e for e in events if e["event"] == "round"]
    assert [h["chip"] for h in hosts] == ["big", "small"]
    assert [x["chips"] for x in rounds[:2]] == [{"big": 2, "small": 2}, {"big": 2}], rounds
    # the kill was real: no process of the killed host is left (checked from /proc, outside the run)
    killed = hosts[1]["pid"]
    assert not Path(f"/proc/{killed}").exists() or "Z" in Path(f"/proc/{killed}/stat").read_text().split()[2]
    # read leniently until the split below is ruled out: two rounds writing one log can tear a line
    steps = lenient(out / "loss.jsonl")
    every = 4  # --save-every; the walk-through kills once a checkpoint is complete
    # the step at the kill: the last one logged before round 2's workers started
    killed_at = max(s["step"] for s in steps if s["time"] < rounds[1]["started"])
    resumed = rounds[1]["resume_from"]
    # from the keepers' memory, not the disk: a snapshot every step, each whole before the next step is logged
    assert rounds[1]["resume_source"] == "memory" and resumed >= every and killed_at - resumed <= 1, rounds[1]
    assert any(e["event"] == "peer_failure" and e["time"] < rounds[1]["started"] for e in events)
    assert rounds[2]["chips"] == {"big": 2, "small": 2}, rounds  # the returned host joined
    assert len(rounds) == 3 and events[-1]["event"] == "finished", rounds
    steps = jsonl(out / "loss.jsonl")
    curve = {s["step"]: s["loss"] for s in steps}  # a step trained again after a resume: its later line counts
    assert sorted(curve) == list(range(1, 61))

    # independent reference: the same model and batch trained in one process
    from heteropp.engine import train_reference
    from heteropp.spec import PRESETS
    want = train_reference(PRESETS["tiny"], 60, 8, verbose=False)["losses"]
    mre = sum(abs(curve[s] - w) / w for s, w in enumerate(want, 1)) / len(want)
    assert mre < 0.015, mre
